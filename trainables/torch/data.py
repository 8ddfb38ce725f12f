"""From the framework's numpy :class:`~search.Dataset` to PyTorch tensors and loaders.

The twin of ``trainables.tf.data``: the same arrays (an image folder is read by
:func:`search.materialize` for both frameworks), the same stratified
``train_fraction`` subsample, the same scaling. Images are scaled to [0, 1] by the training
split's largest value (16 for the digits, 255 for most image folders), so augmentation works
on ordinary image ranges; standardization (mean/std of the training split only) is the first
layer of every model (:class:`Standardize`), so validation inputs are never augmented and
never leak into the statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from search import Dataset as SearchDataset
from search import TrialContext, materialize
from trainables.fraction import subsample


@dataclass(frozen=True)
class Tensors:
    """Training and validation tensors in [0, 1], with the training split's statistics."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    mean: torch.Tensor  # per channel, shape (C,)
    std: torch.Tensor
    num_classes: int
    scale: float  # the inputs were divided by this (the training split's largest value)
    cached: bool = False  # found in this process's cache (trainables.torch.device_data)


def load_data(data: SearchDataset, ctx: TrialContext, train_fraction: float = 1.0) -> Tensors:
    """The trial's tensors: ``data``'s arrays or its image folder (read now, the same way
    in both frameworks: :func:`search.materialize`), subsampled and scaled
    (:func:`to_tensors`). The twin of ``trainables.tf.data.load_data``."""
    return to_tensors(materialize(data, ctx.data_path), train_fraction)


def to_tensors(data: SearchDataset, train_fraction: float = 1.0) -> Tensors:
    """Scales ``data`` to [0, 1] and computes per-channel mean/std on the training split, in
    torch's default dtype (float32 unless the process set another, as an exactness test does).

    Args:
        data: The framework's dataset, inputs ``(n, C, H, W)``.
        train_fraction: Keep only this stratified share of the training split (overfitting demo).
    """
    data = subsample(data, train_fraction)
    x_tr, y_tr = data.x_train, data.y_train
    scale = float(max(x_tr.max(), 1e-8))
    dtype = torch.get_default_dtype()  # float32 unless the process chose another
    x_train = torch.from_numpy(np.ascontiguousarray(x_tr, dtype=np.float32) / scale).to(dtype)
    x_val = torch.from_numpy(np.ascontiguousarray(data.x_val, dtype=np.float32) / scale).to(dtype)
    mean = x_train.mean(dim=(0, 2, 3))
    std = x_train.std(dim=(0, 2, 3)).clamp_min(1e-6)
    return Tensors(
        x_train,
        torch.from_numpy(y_tr).long(),
        x_val,
        torch.from_numpy(data.y_val).long(),
        mean,
        std,
        data.num_classes,
        scale,
    )


class Standardize(torch.nn.Module):
    """Subtracts the training mean and divides by the training std, per channel."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean.reshape(1, -1, 1, 1).clone())
        self.register_buffer("std", std.reshape(1, -1, 1, 1).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


_GRAY = torch.tensor([0.299, 0.587, 0.114])
"""RGB weights of the grayscale (ITU-R 601-2 luma), as in torchvision."""


class Augment:
    """A random crop, rotation, translation and brightness/contrast jitter (and a mirror), per
    image.

    At ``strength`` 1: rotation up to 15 degrees, translation up to 10 % of the image, fill 0,
    bilinear; brightness and contrast factors in [0.7, 1.3] (the ranges of torchvision's
    ``RandomAffine`` and ``ColorJitter``). Written in plain torch because importing
    torchvision costs every new trial process more than a whole epoch of the digits CNN (it
    pulls in ``torch._dynamo``). Draws from torch's global generator, which the
    trainable seeds; DataLoader workers get their own seeds from it.

    Args:
        strength: Augmentation strength in [0, 1] (0: no affine or colour jitter).
        hflip: Mirror each image left-right with probability 0.5.
        crop: Translate by up to ``crop`` pixels each way, edges reflected (0: off): the
            per-image twin of :func:`trainables.torch.device_data.random_crop`.
    """

    def __init__(self, strength: float, hflip: bool = False, crop: int = 0) -> None:
        self.strength, self.hflip, self.crop = float(strength), bool(hflip), int(crop)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Augments one ``(C, H, W)`` image in [0, 1]."""
        s = self.strength
        if self.crop > 0:
            down, right = (int(v) for v in torch.randint(-self.crop, self.crop + 1, (2,)))
            x = crop_one(x, down, right, self.crop)
        if s > 0:
            x = self._affine(x, 15.0 * s, 0.1 * s)
            x = self._jitter(x, 0.3 * s)
        if self.hflip and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x

    @staticmethod
    def _affine(x: torch.Tensor, degrees: float, shift: float) -> torch.Tensor:
        angle = math.radians(float(torch.empty(()).uniform_(-degrees, degrees)))
        # affine_grid works in [-1, 1] coordinates: a shift of f of the image is 2 * f
        tx, ty = (float(torch.empty(()).uniform_(-2 * shift, 2 * shift)) for _ in range(2))
        cos, sin = math.cos(angle), math.sin(angle)
        theta = torch.tensor([[[cos, -sin, tx], [sin, cos, ty]]], dtype=x.dtype)
        grid = torch.nn.functional.affine_grid(theta, [1, *x.shape], align_corners=False)
        return torch.nn.functional.grid_sample(
            x[None], grid, mode="bilinear", padding_mode="zeros", align_corners=False
        )[0]

    @staticmethod
    def _jitter(x: torch.Tensor, amount: float) -> torch.Tensor:
        brightness, contrast = (
            float(torch.empty(()).uniform_(1 - amount, 1 + amount)) for _ in range(2)
        )
        x = (x * brightness).clamp(0, 1)
        gray = (x * _GRAY.to(x.dtype)[:, None, None]).sum(0) if x.shape[0] == 3 else x
        mean = gray.mean()  # contrast blends with the grayscale mean, as torchvision does
        return ((x - mean) * contrast + mean).clamp(0, 1)


def crop_one(x: torch.Tensor, down: int, right: int, pad: int) -> torch.Tensor:
    """One ``(C, H, W)`` image translated by ``(down, right)`` pixels: the ``H x W`` window at
    that offset of the image padded by ``pad`` (edges reflected)."""
    _, h, w = x.shape
    padded = torch.nn.functional.pad(x[None], (pad, pad, pad, pad), mode="reflect")[0]
    return padded[:, pad + down : pad + down + h, pad + right : pad + right + w]


def build_augment(strength: float, hflip: bool = False, crop: int = 0) -> Augment | None:
    """The per-image training transform (:class:`Augment`), or None when there is nothing
    to do (``strength`` 0, ``hflip`` off, no ``crop``)."""
    if strength <= 0 and not hflip and crop <= 0:
        return None
    return Augment(strength, hflip, crop)


class ImageDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Indexable ``(image, label)`` pairs with an optional per-image transform."""

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.x, self.y, self.transform = x, y, transform

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i]
        return (self.transform(x) if self.transform else x), self.y[i]


def train_loader(
    tensors: Tensors,
    batch_size: int,
    seed: int,
    *,
    augment: float = 0.0,
    hflip: bool = False,
    crop: int = 0,
    num_workers: int = 0,
    pin_memory: bool = False,
    rank: int = 0,
    world: int = 1,
) -> DataLoader:
    """The shuffled, optionally augmented training loader (reproducible from ``seed``).

    In a data-parallel trial (``world`` > 1) ``batch_size`` is the global batch: every rank
    shuffles the same way (a ``DistributedSampler`` seeded with ``seed``; call its
    ``set_epoch`` each epoch) and takes its ``batch_size // world`` share of each batch.
    """
    dataset = ImageDataset(tensors.x_train, tensors.y_train, build_augment(augment, hflip, crop))
    if world > 1:
        from torch.utils.data.distributed import DistributedSampler

        sampler: DistributedSampler[tuple[torch.Tensor, torch.Tensor]] = DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed
        )
        return DataLoader(
            dataset,
            batch_size=max(1, batch_size // world),
            sampler=sampler,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=num_workers > 0,
        )
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        generator=generator,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )
