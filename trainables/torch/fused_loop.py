"""A fused array's epochs: K trials of one shape trained as one model, each with its own curve.

:class:`FusedArray` holds K slots. Each slot holds one trial (a member): its filled config,
its seed, its own batches in its own order (the unfused trial's loader,
:func:`trainables.torch.loop.batches`), its learning-rate schedule (torch's scheduler on a
one-parameter optimizer whose ``lr`` the member then trains with), early stopping and epoch
count. One :meth:`FusedArray.epoch` trains every member one epoch with one forward and one
backward per step (:class:`~trainables.torch.fused.FusedSequential`) and returns each
member's metrics, the keys :func:`~trainables.torch.loop.fit_epochs` yields.

What may differ inside an array, per member: ``lr``, ``optimizer`` (sgd, adam, adamw: each
member its own update rule and state), ``weight_decay``, ``momentum``, ``l1``, ``dropout``,
``augment``, ``hflip``, ``clip_norm``, ``clip_value``, ``lr_scheduler`` and its
``step_size``/``gamma``, early stopping, ``label_smoothing``, the seed (its initialization
and data order). What fixes the array's shape (:func:`array_key`): the model's architecture
knobs, ``precision``, what the data path reads, and a ``batch_size`` that is not a multiple
of the array's micro-batch (a multiple sums its gradient over that many steps). A member
whose loss turns NaN reports it as an unfused trial does, and the others go on: no tensor
mixes members.

A slot whose member ended takes the next trial with :meth:`FusedArray.assign` (continuous
batching): its parameters are overwritten, its optimizer state cleared, nothing is rebuilt.

Example (three trials of the digits CNN, two epochs, a slot refilled after the first):
    >>> from search.contract import TrialContext
    >>> from search.contract.dataset import load_digits
    >>> from trainables.torch import cnn
    >>> tensors = fused_tensors(load_digits(0.2, 0), "cpu")
    >>> cfgs = [{**cnn.DEFAULTS, "channels": 4, "lr": lr} for lr in (1e-3, 3e-3)]
    >>> array = FusedArray(cnn.build_model, tensors, [(c, TrialContext(max_epochs=2, seed=i))
    ...                                                for i, c in enumerate(cfgs)])
    >>> first = array.epoch()
    >>> sorted(first), 0 < first[0]["val_accuracy"] <= 1
    ([0, 1], True)
    >>> array.assign(1, cfgs[1], TrialContext(max_epochs=2, seed=7))   # a new trial in slot 1
    >>> [row["epoch"] for row in array.epoch().values()]
    [2, 1]
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from search import Dataset, Metrics, TrialContext
from trainables.knobs import FUSED_PER_MEMBER
from trainables.torch.common import EarlyStopping, autocast, build_scheduler, set_seed
from trainables.torch.data import Tensors, to_tensors
from trainables.torch.fused import FusedSequential, MemberOptimizer, clip_members
from trainables.torch.loop import batches

PER_MEMBER = FUSED_PER_MEMBER
"""The config keys members of one array may differ in; every other key fixes its shape."""
EVAL_BATCH = 512


def shape_key(cfg: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """What two trials must agree on to share an array: every key but :data:`PER_MEMBER`.

    Example:
        >>> shape_key({"lr": 0.1, "batch_size": 64}) == shape_key({"lr": 0.3, "batch_size": 64})
        True
    """
    return tuple(sorted((k, repr(v)) for k, v in cfg.items() if k not in PER_MEMBER))


def array_key(cfg: Mapping[str, Any], micro: int | None = None) -> tuple[tuple[str, str], ...]:
    """What two trials must agree on to share an array whose steps take ``micro`` images a
    member: :func:`shape_key`, where a ``batch_size`` that is a multiple of ``micro`` counts
    as ``micro`` (such a member steps its optimizer every ``batch_size / micro`` steps).

    Example:
        >>> array_key({"batch_size": 128}, 32) == array_key({"batch_size": 32}, 32)
        True
        >>> array_key({"batch_size": 48}, 32) == array_key({"batch_size": 32}, 32)
        False
    """
    if micro and int(cfg["batch_size"]) % micro == 0:
        cfg = {**cfg, "batch_size": micro}
    return shape_key(cfg)


def micro_batches(loader: Any, micro: int) -> Iterator[tuple[Any, Any, float, bool]]:
    """A member's batches in pieces of ``micro``: each piece, its share of its batch (the
    weight of its mean loss in the batch's mean) and whether it ends its batch.

    Example:
        >>> pieces = micro_batches([(torch.zeros(5, 1), torch.zeros(5))], 2)
        >>> [(len(y), round(w, 1), end) for _, y, w, end in pieces]
        [(2, 0.4, False), (2, 0.4, False), (1, 0.2, True)]
    """
    for x, y in loader:
        n = len(y)
        for i in range(0, n, micro):
            yield x[i : i + micro], y[i : i + micro], len(y[i : i + micro]) / n, i + micro >= n


def fused_tensors(data: Dataset, device: str | torch.device) -> Tensors:
    """The array's data, once for every member (all of them read the same split)."""
    host, dev = to_tensors(data), torch.device(device)
    moved = {name: getattr(host, name).to(dev) for name in ("x_train", "y_train", "x_val", "y_val")}
    return dataclasses.replace(host, **moved)


def member_losses(logits: torch.Tensor, y: torch.Tensor, smoothing: torch.Tensor) -> torch.Tensor:
    """Each member's mean cross-entropy with its own label smoothing: ``logits`` ``(K, B, C)``,
    ``y`` ``(K, B)``, ``smoothing`` ``(K,)``; ``F.cross_entropy``'s formula, batched.

    Example:
        >>> logits, y = torch.randn(2, 5, 3), torch.randint(0, 3, (2, 5))
        >>> got = member_losses(logits, y, torch.tensor([0.0, 0.1]))
        >>> want = [F.cross_entropy(logits[1], y[1], label_smoothing=0.1)]
        >>> torch.allclose(got[1], want[0])
        True
    """
    logp = logits.float().log_softmax(dim=2)
    nll = -logp.gather(2, y.unsqueeze(2)).squeeze(2)
    eps = smoothing.to(logp).view(-1, 1)
    return ((1 - eps) * nll - eps * logp.mean(dim=2)).mean(dim=1)


@dataclass
class _Member:
    """One slot's trial."""

    cfg: Mapping[str, Any]
    ctx: TrialContext
    loader: Any
    schedule: torch.optim.Optimizer  # one parameter; its lr is the member's
    scheduler: Any
    when: str
    stopper: EarlyStopping
    epoch: int = 0
    images: int = 0
    done: bool = False
    sums: dict[str, torch.Tensor] = field(default_factory=dict)


class FusedArray:
    """K trials of one shape (:func:`shape_key`) on one device, as one model.

    Args:
        build_model: The built-in's ``build_model(cfg, tensors)`` (an ``nn.Sequential``).
        tensors: The data every member trains on (:func:`fused_tensors`).
        members: One ``(filled config, context)`` per slot; ``max_epochs`` and ``seed`` are
            read from each context.
        micro_batch: The images a member trains per step (the first member's ``batch_size``
            where it is not a multiple of it, or not given); a member whose ``batch_size`` is
            a multiple accumulates its gradient over that many steps, then steps its
            optimizer (:func:`array_key`).
    """

    def __init__(
        self,
        build_model: Callable[[Mapping[str, Any], Tensors], nn.Sequential],
        tensors: Tensors,
        members: Sequence[tuple[Mapping[str, Any], TrialContext]],
        micro_batch: int | None = None,
    ) -> None:
        self.build, self.tensors = build_model, tensors
        self.device = tensors.x_train.device
        batch = int(members[0][0]["batch_size"])
        self.micro = micro_batch if micro_batch and batch % micro_batch == 0 else batch
        self.key = array_key(members[0][0], self.micro)
        models = [self._model(cfg, ctx) for cfg, ctx in members]
        self.model = FusedSequential(models).to(self.device)
        self.params = [p for p, _ in self.model.member_params()]
        self.weights = [p for p, weight in self.model.member_params() if weight]
        self.k = len(members)
        families = [cfg["optimizer"] for cfg, _ in members]
        self.optimizer = MemberOptimizer(self.params, families, self.k)
        self.slots: list[_Member] = [self._member(cfg, ctx) for cfg, ctx in members]
        for k in range(self.k):
            self._settings(k)

    def _model(self, cfg: Mapping[str, Any], ctx: TrialContext) -> nn.Sequential:
        if array_key(cfg, self.micro) != self.key:
            raise ValueError("a fused array's members must agree on every shape knob")
        set_seed(ctx.seed)  # the unfused trial's initialization (trainables.torch.common.setup)
        return self.build(cfg, self.tensors)  # type: ignore[return-value]

    def _member(self, cfg: Mapping[str, Any], ctx: TrialContext) -> _Member:
        loader = batches(self.tensors, cfg, ctx, self.device)
        schedule = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg["lr"])
        scheduler, when = build_scheduler(schedule, cfg, ctx.max_epochs, len(loader))
        stopper = EarlyStopping(cfg["early_stopping_patience"], cfg["early_stopping_min_delta"])
        return _Member(cfg, ctx, loader, schedule, scheduler, when, stopper)

    def _settings(self, k: int) -> None:
        cfg = self.slots[k].cfg
        self.optimizer.families[k] = cfg["optimizer"]
        self.optimizer.weight_decay[k] = cfg["weight_decay"]
        self.optimizer.momentum[k] = cfg.get("momentum", 0.0)

    def assign(self, slot: int, cfg: Mapping[str, Any], ctx: TrialContext) -> None:
        """A new trial takes ``slot``: its own initialization, optimizer state and schedule."""
        self.model.load_member(slot, self._model(cfg, ctx).to(self.device))
        self.optimizer.reset(slot)
        self.slots[slot] = self._member(cfg, ctx)
        self._settings(slot)

    def member_state(self, slot: int) -> dict[str, torch.Tensor]:
        """The ``state_dict`` of ``slot``'s model, as its unfused trial's model would have it."""
        return self.model.member_state(slot)

    def _column(self, key: str) -> torch.Tensor:
        """Every slot's ``key``, ``(K,)``: read once an epoch (a slot changes between epochs)."""
        if key not in self._columns:
            self._columns[key] = torch.tensor([float(m.cfg.get(key, 0.0)) for m in self.slots])
        return self._columns[key]

    def _steps(self, running: list[int]) -> Iterator[tuple[torch.Tensor, ...]]:
        """Each step's ``(K, b, ...)`` images and ``(K, b)`` labels (a running member's own
        micro-batch; an idle slot, or a member whose epoch ended first, a copy of another's),
        and ``(K,)`` columns: whether the slot trains on its own images this step, the
        weight of its loss (its piece's share of its batch) and whether its batch ends."""
        for m in (self.slots[k] for k in running):
            m.epoch += 1
            sampler = m.loader if hasattr(m.loader, "set_epoch") else m.loader.sampler
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(m.epoch)
        pieces = [micro_batches(self.slots[k].loader, self.micro) for k in running]
        for step in itertools.zip_longest(*pieces):
            got = {k: piece for k, piece in zip(running, step, strict=True) if piece is not None}
            fill = next(iter(got.values()))
            xs = [got.get(k, fill)[0].to(self.device) for k in range(self.k)]
            ys = [got.get(k, fill)[1].to(self.device) for k in range(self.k)]
            if len({len(y) for y in ys}) > 1:
                raise RuntimeError("a fused array's members drew pieces of different sizes")
            present = torch.tensor([k in got for k in range(self.k)])
            weight = torch.tensor([got.get(k, fill)[2] for k in range(self.k)])
            ends = torch.tensor([got.get(k, fill)[3] for k in range(self.k)])
            yield torch.stack(xs), torch.stack(ys), present, weight, ends

    def running(self) -> list[int]:
        """The slots whose member has epochs left."""
        return [k for k, m in enumerate(self.slots) if not m.done]

    def vacate(self, slot: int) -> None:
        """``slot``'s member leaves (pruned, failed, gone): the slot trains no more until
        :meth:`assign` gives it the next trial."""
        self.slots[slot].done = True

    def done(self, slot: int) -> bool:
        """Whether ``slot``'s member has ended (its last epoch, early stopping, vacated)."""
        return self.slots[slot].done

    def epoch(self, only: set[int] | None = None) -> dict[int, Metrics]:
        """One epoch of every running member (of those in ``only``, when given); returns its
        metrics by slot (with ``epoch``, the member's own count, and ``array_members``, how
        many trained together). A member ends after its last epoch or its early stop."""
        running = [k for k in self.running() if only is None or k in only]
        if not running:
            return {}
        start = time.perf_counter()
        self._columns: dict[str, torch.Tensor] = {}
        active = torch.zeros(self.k, dtype=torch.bool)
        active[running] = True
        lrs = [self.slots[k].schedule.param_groups[0]["lr"] for k in range(self.k)]
        zeros = torch.zeros(self.k, device=self.device)
        names = ("loss", "correct", "norm", "applied", "seen")
        totals = {name: zeros.clone() for name in names}
        self.model.train()
        for xb, yb, present, weight, ends in self._steps(running):
            on = active & present
            loss, correct, norms = self._step(xb, yb, on, weight, ends)
            counted = on.to(zeros) * yb.shape[1]
            totals["loss"] += loss.detach() * counted
            totals["correct"] += correct * on.to(zeros)
            stepped = (on & ends).to(zeros)  # a norm is a step's: after its batch's last piece
            totals["norm"] = torch.maximum(totals["norm"], norms[0].to(zeros) * stepped)
            totals["applied"] = torch.maximum(totals["applied"], norms[1].to(zeros) * stepped)
            totals["seen"] += counted
        val = self._evaluate()
        elapsed = time.perf_counter() - start
        out: dict[int, Metrics] = {}
        for k in running:
            out[k] = self._finish(k, totals, val, lrs[k], elapsed)
            out[k]["array_members"] = float(len(running))
        return out

    def train_steps(self, steps: int) -> int:
        """Trains ``steps`` batches of every running member, epochs rolling over, without
        metrics or schedules' epoch ends: what ``fuse: auto``'s probe times
        (``trainables/torch/fused_rates.py``). Returns the images trained, over all members."""
        running = self.running()
        active = torch.zeros(self.k, dtype=torch.bool)
        active[running] = True
        self._columns = {}
        self.model.train()
        images = 0
        while steps > 0:
            for xb, yb, present, weight, ends in self._steps(running):
                self._step(xb, yb, active & present, weight, ends)
                images += yb.shape[0] * yb.shape[1]
                steps -= 1
                if steps <= 0:
                    break
        return images

    def _step(
        self,
        xb: torch.Tensor,
        yb: torch.Tensor,
        on: torch.Tensor,
        weight: torch.Tensor,
        ends: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One forward and backward of every slot; the members of ``on`` whose batch
        ``ends`` here step their optimizer on the gradient their batch's pieces summed (each
        piece's loss weighted by ``weight``), the others keep theirs for the next piece."""
        precision = self.slots[0].cfg["precision"]
        with autocast(precision, self.device):
            logits = self.model(xb)
        k = logits.shape[0]
        losses = member_losses(logits, yb, self._column("label_smoothing"))
        w, l1 = weight.to(losses), self._column("l1").to(losses)
        total = (w * losses).sum()
        if bool((l1 > 0).any()):
            penalty = torch.stack([p.view(k, -1).abs().sum(1) for p in self.weights]).sum(0)
            total = total + (w * l1 * penalty).sum()
        total.backward()  # adds to what a member's earlier pieces of this batch left
        step = on & ends
        gate = step.to(self._column("clip_norm"))
        norms = clip_members(
            self.params, self._column("clip_norm") * gate, self._column("clip_value") * gate
        )
        for i, member in enumerate(self.slots):
            self.optimizer.lr[i] = member.schedule.param_groups[0]["lr"]
        self.optimizer.step(step)
        drop = ~(on & ~ends).view(k, 1).to(self.device)  # mid-batch ones keep theirs
        for p in self.params:
            if p.grad is not None:  # a fill, not a product: a NaN gradient leaves no trace
                p.grad.view(k, -1).masked_fill_(drop, 0.0)
        for i in torch.nonzero(step).flatten().tolist():
            self.slots[i].schedule.step()  # a no-op (no gradient); torch's schedulers expect it
            if self.slots[i].when == "batch":
                self.slots[i].scheduler.step()
        correct = (logits.argmax(dim=2) == yb).sum(1).float()
        return losses, correct, norms

    @torch.no_grad()
    def _evaluate(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every member's mean cross-entropy and accuracy on the whole validation split."""
        self.model.eval()
        x, y = self.tensors.x_val, self.tensors.y_val
        loss_sum = torch.zeros(self.k, device=self.device)
        correct = torch.zeros(self.k, device=self.device)
        for i in range(0, len(y), EVAL_BATCH):
            xb, yb = x[i : i + EVAL_BATCH], y[i : i + EVAL_BATCH]
            with autocast(self.slots[0].cfg["precision"], self.device):
                logits = self.model(xb.expand(self.k, *xb.shape)).float()
            targets = yb.expand(self.k, -1)
            flat = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
            loss_sum += flat.view(self.k, -1).sum(1)
            correct += (logits.argmax(dim=2) == targets).sum(1)
        return loss_sum / len(y), correct / len(y)

    def _finish(
        self,
        k: int,
        totals: dict[str, torch.Tensor],
        val: tuple[torch.Tensor, torch.Tensor],
        lr: float,
        elapsed: float,
    ) -> Metrics:
        member = self.slots[k]
        val_loss, val_accuracy = float(val[0][k]), float(val[1][k])
        if member.when == "epoch":
            member.scheduler.step()
        elif member.when == "val_loss":
            member.scheduler.step(val_loss)
        stop = member.stopper.update(val_loss)
        member.done = stop or member.epoch >= member.ctx.max_epochs
        seen = float(totals["seen"][k])
        return {
            "epoch": member.epoch,
            "train_loss": float(totals["loss"][k]) / seen,
            "train_accuracy": float(totals["correct"][k]) / seen,
            "grad_norm": float(totals["norm"][k]),
            "grad_norm_applied": float(totals["applied"][k]),
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "lr": lr,
            "epoch_time_s": elapsed,
            "train_images_per_s": seen / max(elapsed, 1e-9),
        }
