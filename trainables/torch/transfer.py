"""Transfer learning from a torchvision backbone (the ``torch_transfer`` trainable).

The backbone is built with ``weights=None`` and loaded from a local state_dict file, so nothing
is downloaded. Inputs (the digits, or an image folder read at the data's ``image_size``:
:func:`trainables.torch.data.load_data`) are standardized, resized to the trainable's
``image_size`` and, when gray, repeated to 3 channels inside the model; a new classifier head
replaces the backbone's own.

Config keys (all optional): the shared ones of
:data:`~trainables.torch.common.COMMON_DEFAULTS`, ``augment``/``hflip``, and:

    backbone          resnet18 | mobilenet_v3_small (default resnet18)
    weights_path      local state_dict file (``torch.save``); None trains from scratch
    freeze_backbone   train only the new head (default True; frozen batch norms keep their
                      statistics). False fine-tunes everything
    unfreeze_blocks   with freeze_backbone: also train the last N top-level blocks
                      (resnet18: layer4, layer3, ...; mobilenet: its pre-head dense layer,
                      then features[-1], features[-2], ...)
    image_size        side the inputs are resized to inside the model (default 32)

An epoch costs several times more with ``unfreeze_blocks`` or the whole backbone trained
than frozen (benchmarks/RESULTS.md); the frozen default keeps a trial's epochs short.

Make a weights file (a backbone pretrained on a different task: predicting how each training
digit was rotated, 0/90/180/270 degrees)::

    python -m trainables.torch.transfer --pretrain results/backbones/resnet18-digits.pt
"""

from __future__ import annotations

import argparse
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from search import Dataset, Metrics, TrialContext, load_digits, trainable
from trainables.knobs import TORCH_TRANSFER_DEFAULTS
from trainables.torch.common import read_config, setup
from trainables.torch.data import Standardize, Tensors, to_tensors
from trainables.torch.device_data import trial_data
from trainables.torch.export import make_exporter
from trainables.torch.loop import Fitted, fit_epochs

DEFAULTS: dict[str, Any] = TORCH_TRANSFER_DEFAULTS  # framework-free: the driver reads them there
"""Every key :func:`train` reads, with its default."""
BACKBONES = {"backbone": ("resnet18", "mobilenet_v3_small")}
HEAD = {"resnet18": "fc", "mobilenet_v3_small": "classifier.3"}
"""Name of each backbone's final classifier layer, which the new head replaces."""


def make_backbone(name: str, weights_path: str | None) -> nn.Module:
    """The torchvision model, with weights from ``weights_path`` (its head keys are ignored).

    Raises:
        ValueError: When the file is not a state_dict of this architecture.
    """
    import torchvision

    model: nn.Module = getattr(torchvision.models, name)(weights=None)
    if weights_path:
        if not Path(weights_path).is_file():
            raise FileNotFoundError(
                f"weights_path {weights_path} not found; make one with: "
                f"python -m trainables.torch.transfer --pretrain {weights_path}"
            )
        head = HEAD[name] + "."
        state = torch.load(weights_path, map_location="cpu", weights_only=True)
        state = {k: v for k, v in state.items() if not k.startswith(head)}
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith(head)]
        if missing or unexpected:
            raise ValueError(
                f"{weights_path} is not a {name} state_dict "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
            )
    return model


def replace_head(model: nn.Module, name: str, num_classes: int, dropout: float) -> nn.Module:
    """Puts a new ``Dropout -> Linear(num_classes)`` head in place of the backbone's; returns it."""
    if name == "resnet18":
        features = cast(nn.Linear, model.fc).in_features
        model.fc = nn.Sequential(nn.Dropout(dropout), nn.Linear(features, num_classes))
        return model.fc
    classifier = cast(nn.Sequential, model.classifier)
    cast(nn.Dropout, classifier[2]).p = dropout  # mobilenet's own dropout, right before its head
    classifier[3] = nn.Linear(cast(nn.Linear, classifier[3]).in_features, num_classes)
    return classifier[3]


def top_blocks(model: nn.Module, name: str) -> list[nn.Module]:
    """The backbone's top-level blocks below the head, last one last."""
    if name == "resnet18":
        return [model.get_submodule(f"layer{i}") for i in range(1, 5)]
    return [*cast(nn.Sequential, model.features), cast(nn.Sequential, model.classifier)[0]]


class TransferNet(nn.Module):
    """Standardize, resize to ``image_size``, repeat gray to RGB, then the backbone.

    In training mode, batch norms whose parameters are all frozen stay in eval mode, so a
    frozen backbone keeps its pretrained statistics too.
    """

    def __init__(self, backbone: nn.Module, standardize: Standardize, image_size: int) -> None:
        super().__init__()
        self.standardize, self.backbone, self.image_size = standardize, backbone, image_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.standardize(x)
        x = F.interpolate(
            x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False
        )
        return self.backbone(x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x)

    def train(self, mode: bool = True) -> TransferNet:
        super().train(mode)
        for module in self.backbone.modules():
            is_norm = isinstance(module, nn.modules.batchnorm._BatchNorm)
            if is_norm and not any(p.requires_grad for p in module.parameters()):
                module.eval()
        return self


def build_model(cfg: Mapping[str, Any], tensors: Tensors) -> TransferNet:
    """The backbone with its new head, frozen and unfrozen as ``cfg`` says."""
    name = cfg["backbone"]
    backbone = make_backbone(name, cfg["weights_path"])
    head = replace_head(backbone, name, tensors.num_classes, cfg["dropout"])
    if cfg["freeze_backbone"]:
        backbone.requires_grad_(False)
        n = cfg["unfreeze_blocks"]
        for module in [head, *(top_blocks(backbone, name)[-n:] if n > 0 else [])]:
            module.requires_grad_(True)
    return TransferNet(backbone, Standardize(tensors.mean, tensors.std), cfg["image_size"])


# data_parallel: DDP when a trial has several workers (search.compute.distributed).
@trainable(defaults=DEFAULTS, data_parallel=True)
def train(
    config: Mapping[str, Any], data: Dataset, ctx: TrialContext
) -> Generator[Metrics, None, Fitted]:
    """The ``torch_transfer`` trainable: one metrics dict per epoch (``trainables.torch.loop``)."""
    cfg, device = setup(config, DEFAULTS, ctx, BACKBONES)
    tensors = trial_data(data, cfg, ctx, device)
    model = build_model(cfg, tensors)
    return (yield from fit_epochs(model, tensors, cfg, ctx, device))


export = train.exporter(make_exporter(train))
"""The export hook: ``model.safetensors``, checked ONNX (:mod:`trainables.torch.export`)."""


def rotated(x: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image turned by a random multiple of 90 degrees, and that multiple as its label."""
    k = torch.randint(0, 4, (len(x),), generator=generator)
    turns = torch.stack([torch.rot90(x, i, dims=(2, 3)) for i in range(4)], dim=1)
    return turns[torch.arange(len(x)), k], k


def pretrain_backbone(
    path: str | Path,
    backbone: str = "resnet18",
    epochs: int = 1,
    image_size: int = 32,
    seed: int = 0,
) -> str:
    """Trains ``backbone`` to tell how digits were rotated and saves its state_dict at ``path``.

    A pretext task on the training split of the default digits split (val_fraction 0.2,
    split_seed 0), without the class labels, so the weights come from a different task.

    Returns:
        ``path`` as a string.
    """
    base = to_tensors(load_digits(0.2, 0))
    gen = torch.Generator().manual_seed(seed)
    (x_tr, k_tr), (x_va, k_va) = rotated(base.x_train, gen), rotated(base.x_val, gen)
    tensors = Tensors(x_tr, k_tr, x_va, k_va, base.mean, base.std, 4, base.scale)
    config = {"backbone": backbone, "image_size": image_size, "lr": 1e-3}
    cfg = read_config(config, DEFAULTS, BACKBONES)
    ctx = TrialContext(max_epochs=epochs, seed=seed, num_threads=torch.get_num_threads())
    torch.manual_seed(seed)
    model = build_model(cfg, tensors)
    for _ in fit_epochs(model, tensors, cfg, ctx, torch.device("cpu")):
        pass
    head = HEAD[backbone] + "."
    state = {k: v for k, v in model.backbone.state_dict().items() if not k.startswith(head)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return str(path)


def main(argv: list[str] | None = None) -> None:
    """``python -m trainables.torch.transfer --pretrain PATH``: writes a backbone weights file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain", metavar="PATH", required=True, help="weights file to write")
    parser.add_argument("--backbone", default="resnet18", choices=BACKBONES["backbone"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = pretrain_backbone(args.pretrain, args.backbone, args.epochs, args.image_size, args.seed)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
