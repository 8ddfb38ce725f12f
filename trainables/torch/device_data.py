"""The dataset on the trial's device, once per process, and batches drawn and augmented there.

A trial of a small convnet on a GPU spends more time in Python feeding it than in its kernels
when every batch is collated by a ``DataLoader`` on the host and copied over. airbench's way
(KellerJordan/cifar10-airbench) is the one taken here: the whole dataset lives on the GPU,
each epoch's shuffle and the random crops and flips are tensor operations on whole batches
there, and nothing is collated.

Ray reuses a worker process for the next trial (``reuse_actors``), so the tensors are kept
for it in a per-process cache (:func:`trial_tensors`), keyed by what the data is
(:func:`data_key`: its name, split, shapes and a digest of its bytes), the device and the
share trained on; a trial of other data replaces the entry, so a process holds one dataset at
most. A user's trainable gets the same with two calls::

    from trainables.torch.device_data import DeviceBatches, trial_tensors

    tensors = trial_tensors(data, ctx, device)             # Tensors on the device, cached
    batches = DeviceBatches(tensors, 512, ctx.seed, crop=2, hflip=True)
    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        batches.set_epoch(epoch)                           # the same batches on a retry
        for xb, yb in batches:                             # on the device, augmented
            ...

:func:`random_crop` and :func:`random_flip` are plain functions of a batch and its drawn
offsets and flips, proved equal to the per-image host transform
(:class:`trainables.torch.data.Augment`) by the tests.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from search import Dataset, TrialContext
from trainables.torch.data import Tensors, load_data

SAMPLED_ROWS = 64
"""Rows of each array hashed into :func:`data_key` when the array is large."""
WHOLE_BYTES = 16 * 2**20
"""Arrays up to this size are hashed whole."""


def _digest(array: np.ndarray, h: Any) -> None:
    h.update(f"{array.dtype}{array.shape}".encode())
    if array.nbytes <= WHOLE_BYTES or len(array) <= SAMPLED_ROWS:
        h.update(np.ascontiguousarray(array).tobytes())
        return
    rows = np.linspace(0, len(array) - 1, SAMPLED_ROWS).astype(np.int64)
    h.update(np.ascontiguousarray(array[rows]).tobytes())


def data_key(data: Dataset, *parts: object) -> str:
    """What ``data`` is, as a short hex string, with ``parts`` (the device, the share).

    Arrays up to :data:`WHOLE_BYTES` are hashed whole; larger ones by their shape and
    :data:`SAMPLED_ROWS` evenly spaced rows, and labels always whole: a copy of the same data
    (Ray's object store hands each trial a fresh one) gives the same key, other data another.

    Example:
        >>> from search import load_digits
        >>> digits = load_digits(0.2, 0)
        >>> data_key(digits, "cpu") == data_key(load_digits(0.2, 0), "cpu")
        True
        >>> data_key(digits, "cpu") == data_key(load_digits(0.2, 1), "cpu")
        False
    """
    h = hashlib.blake2b(digest_size=16)
    fields = (data.name, data.path, data.image_size, data.val_fraction, data.split_seed)
    h.update(repr((fields, parts)).encode())
    for array in (data.x_train, data.x_val):
        _digest(array, h)
    for labels in (data.y_train, data.y_val):
        h.update(np.ascontiguousarray(labels).tobytes())
    return h.hexdigest()


@dataclasses.dataclass
class _Cache:
    key: str | None = None
    tensors: Tensors | None = None
    loads: int = 0  # how often this process put data on a device
    hits: int = 0


CACHE = _Cache()
"""This process's one cached dataset (and how often it was loaded and found)."""


def trial_tensors(
    data: Dataset,
    ctx: TrialContext,
    device: torch.device,
    train_fraction: float = 1.0,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> Tensors:
    """The trial's :class:`~trainables.torch.data.Tensors` on ``device``: from this process's
    cache when an earlier trial put the same data there, else loaded
    (:func:`trainables.torch.data.load_data`: an image folder is read now), moved and cached.

    The returned tensors' ``cached`` says which (the built-ins yield it as ``data_cached``).
    """
    dtype = torch.get_default_dtype()
    key = data_key(data, ctx.data_path, str(device), train_fraction, str(memory_format), str(dtype))
    if CACHE.key == key and CACHE.tensors is not None:
        CACHE.hits += 1
        return dataclasses.replace(CACHE.tensors, cached=True)
    CACHE.key, CACHE.tensors = None, None  # the old entry's memory goes before the new one
    host = load_data(data, ctx, train_fraction)
    tensors = dataclasses.replace(
        host,
        x_train=host.x_train.to(device).contiguous(memory_format=memory_format),
        y_train=host.y_train.to(device),
        x_val=host.x_val.to(device).contiguous(memory_format=memory_format),
        y_val=host.y_val.to(device),
        cached=False,
    )
    CACHE.key, CACHE.tensors, CACHE.loads = key, tensors, CACHE.loads + 1
    return tensors


def trial_data(
    data: Dataset,
    cfg: Mapping[str, Any],
    ctx: TrialContext,
    device: torch.device,
    train_fraction: float = 1.0,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> Tensors:
    """What a built-in trains on: :func:`trial_tensors` on ``device`` when its batches come
    from there (:func:`on_device`), else on the CPU for a ``DataLoader``; cached either way."""
    where = device if on_device(cfg, device) else torch.device("cpu")
    return trial_tensors(data, ctx, where, train_fraction, memory_format)


def on_device(cfg: Mapping[str, Any], device: torch.device) -> bool:
    """Whether a trial's batches come from the dataset on its device (:class:`DeviceBatches`)
    rather than a host ``DataLoader``: the knob ``data_placement`` (``device`` or ``host``),
    and for ``auto`` on a GPU unless the per-image affine ``augment`` is asked for (it runs
    on the host only); on a CPU ``auto`` keeps the ``DataLoader``.

    Example:
        >>> cpu, gpu = torch.device("cpu"), torch.device("cuda")
        >>> on_device({"data_placement": "auto"}, cpu), on_device({"data_placement": "auto"}, gpu)
        (False, True)
        >>> on_device({"data_placement": "auto", "augment": 0.2}, gpu)
        False
        >>> on_device({"data_placement": "device"}, cpu)
        True
    """
    placement = cfg.get("data_placement", "auto")
    if placement != "auto":
        return bool(placement == "device")
    return device.type == "cuda" and not cfg.get("augment", 0.0)


# ---- augmentation of whole batches, on any device ---------------------------------------------


def random_crop(x: torch.Tensor, shifts: torch.Tensor, pad: int) -> torch.Tensor:
    """Each image of ``x`` (``(B, C, H, W)``) translated by its ``shifts`` row (``(B, 2)``
    integers in ``[-pad, pad]``: down, right), the edge reflected: a random crop of the image
    padded by ``pad``, for a whole batch at once.

    Example:
        >>> x = torch.arange(16.0).reshape(1, 1, 4, 4)
        >>> random_crop(x, torch.tensor([[0, 1]]), 1)[0, 0, 0].tolist()
        [1.0, 2.0, 3.0, 2.0]
    """
    if pad <= 0:
        return x
    b, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    rows = torch.arange(h, device=x.device) + pad + shifts[:, :1]  # (B, H)
    cols = torch.arange(w, device=x.device) + pad + shifts[:, 1:]  # (B, W)
    batch = torch.arange(b, device=x.device)[:, None, None]
    out = padded[batch, :, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous(memory_format=_format(x))


def random_flip(x: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """``x`` with the images where ``flips`` (``(B,)`` bool) is true mirrored left-right."""
    return torch.where(flips[:, None, None, None], x.flip(-1), x)


def _format(x: torch.Tensor) -> torch.memory_format:
    channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
    return torch.channels_last if channels_last and x.shape[1] > 1 else torch.contiguous_format


class DeviceBatches:
    """Shuffled training batches of ``tensors`` (already on their device), augmented there.

    Each epoch is a pure function of ``(seed, epoch)`` (:meth:`set_epoch`): its permutation,
    crop shifts and flips are drawn on the CPU from a generator seeded with both, so the same
    batches come on any device and again in a retried trial. The last partial batch is
    dropped (one batch shape: a compiled graph is not compiled again). In a data-parallel trial
    each rank takes its ``rank::world`` share of every global batch.

    Args:
        tensors: The trial's tensors, on the device the batches are wanted on.
        batch_size: The global batch.
        seed: The trial's seed.
        crop: Random translation of up to ``crop`` pixels each way (reflected edges); 0 = off.
        hflip: Mirror each image left-right with probability 0.5.
    """

    def __init__(
        self,
        tensors: Tensors,
        batch_size: int,
        seed: int,
        *,
        crop: int = 0,
        hflip: bool = False,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.x, self.y = tensors.x_train, tensors.y_train
        self.batch_size = max(1, min(int(batch_size), len(self.y)))
        self.seed, self.crop, self.hflip = int(seed), int(crop), bool(hflip)
        self.rank, self.world, self.epoch = rank, world, 1

    def set_epoch(self, epoch: int) -> None:
        """Draws the batches of ``epoch`` next."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.y) // self.batch_size

    def draws(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This epoch's permutation, crop shifts ``(n, 2)`` and flips ``(n,)``, on the CPU."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        n = len(self.y)
        order = torch.randperm(n, generator=gen)
        shifts = torch.randint(-self.crop, self.crop + 1, (n, 2), generator=gen)
        flips = torch.rand(n, generator=gen) < 0.5
        return order, shifts, flips

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        device = self.x.device
        order, shifts, flips = (t.to(device) for t in self.draws())
        for i in range(len(self)):
            take = order[i * self.batch_size : (i + 1) * self.batch_size][self.rank :: self.world]
            xb = self.x[take]
            if self.crop > 0:
                xb = random_crop(xb, shifts[take], self.crop)
            if self.hflip:
                xb = random_flip(xb, flips[take])
            yield xb, self.y[take]
