"""``resources.fuse: auto`` (the default): fuse where a measurement on the run's GPU says so.

The decision, in order, each ending in one line the run prints (:func:`decide_fuse`):

1. A trainable that does not fuse (not a PyTorch built-in of
   :data:`~search.tuning.fusion.FUSABLE`, not made by :func:`search.pytorch.sequential`),
   or trials on several devices each: unfused, and nothing printed (nothing to decide).
2. Trials on CPUs: unfused. Each trial is a worker process on a core of its own, and the
   cores already run them side by side; an array on the same cores trades the processes
   for threads and adds a process per member. Measured on this project's 2-core machine,
   cold from the command line: a fused study of 16 trials took 1.24 to 1.47 times its
   unfused time, one of 32 trials 0.98 (RESULTS "Fused trial arrays (issue 44)"): the
   members' start-up eats what the array wins. ``fuse: N`` fuses on CPUs anyway.
3. A space that varies a knob that fixes an array's shape (``precision``, the
   architecture: everything but ``FUSED_PER_MEMBER`` of ``trainables/knobs.py``, and a
   ``batch_size`` not chosen from a list, whose sizes' common divisor would be the array's
   micro-batch, :func:`~search.tuning.fusion.micro_batch`): unfused. Each value would
   train in an array of its own, with idle slots computed for nothing, and ``fp16`` does
   not fuse at all.
4. Trials on GPUs: one Ray task holding one GPU measures the images per second of the
   space's largest config as an array of 1, 2, 4, ... members
   (``trainables/torch/fused_rates.py``), stopping where another member adds less than
   ``gpus_per_trial: auto``'s tolerance, and compares the best with the unfused trials on
   that GPU: the rates ``gpus_per_trial: auto`` measured, else the same measurement of the
   packing the spec asks for (:mod:`search.compute.gpu_rates`). It fuses the fewest members
   within the tolerance of the best array, when that array beats the unfused trials by
   :data:`MARGIN` (the members' own light processes and their epochs' hand-offs cost
   something the probe does not see); else unfused.

Example (step 4's arithmetic, with figures of the kind a GPU gives):
    >>> choice(({1: 2_000.0, 2: 3_900.0, 4: 7_400.0, 8: 7_500.0}), unfused=2_400.0)[0]
    4
    >>> choice({1: 2_000.0, 2: 2_300.0}, unfused=2_400.0)[0] is None
    True
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from search.compute.gpu_memory import largest_config
from search.compute.gpu_rates import measure_rates
from search.compute.throughput import TOLERANCE, choose, next_count
from search.contract.registry import declared_defaults, resolve_function
from search.errors import one_line
from search.tuning.fusion import builder, micro_batch

if TYPE_CHECKING:
    from search.compute.data import SharedData
    from search.compute.placement import Placement
    from search.specs.schema import StudySpec

MARGIN = 0.2
"""How much more than the unfused trials' images per second an array must train to fuse."""
MAX_MEMBERS = 32
"""The most members ``auto`` measures (``resources.max_concurrent`` caps it lower)."""
PER_MEMBER_AT = "trainables.knobs"
"""Where the knobs members of one array may differ in live (``FUSED_PER_MEMBER``)."""
RATES = "trainables.torch.fused_rates:array_rates"


@dataclass(frozen=True)
class FuseDecision:
    """How many members an array takes (``None``: trials run unfused) and the run's line
    saying why (empty when there was nothing to decide)."""

    members: int | None
    line: str = ""


def decide_fuse(spec: StudySpec, placement: Placement, data: SharedData) -> FuseDecision:
    """``resources.fuse`` resolved for this run on this cluster (``auto`` as the module says;
    ``off`` and N as given)."""
    fuse = spec.resources.fuse
    if fuse != "auto":
        return FuseDecision(fuse)
    if builder(spec.trainable) is None or (spec.resources.workers_per_trial or 1) > 1:
        return FuseDecision(None)
    force = "resources.fuse: N fuses anyway"
    if placement.gpus_per_trial <= 0:
        return FuseDecision(
            None,
            f"fuse auto: off on CPUs: {placement.concurrency} trial(s) at once already "
            f"run side by side, a process a core ({force})",  # fmt: skip
        )
    if split := shape_params(spec):
        return FuseDecision(
            None,
            f"fuse auto: off: the space varies {', '.join(split)}, each value of which "
            f"trains in an array of its own ({force})",  # fmt: skip
        )
    config = largest_config(spec.space, spec.fixed)
    if micro := micro_batch(spec):  # the array steps micro-batches, whatever a member's batch
        config = {**config, "batch_size": micro}
    if config.get("precision", "fp32") == "fp16":
        return FuseDecision(None, "fuse auto: off: fp16 trials do not fuse (fp32 or bf16 do)")
    cap = min(MAX_MEMBERS, spec.resources.max_concurrent or MAX_MEMBERS)
    fused = array_rates(spec, data, config, cap)
    unfused = max(dict(placement.rates).values(), default=0.0) or packed_rate(
        spec, placement, data, config
    )
    members, why = choice(fused, unfused)
    return FuseDecision(members, f"fuse auto: {why}")


def shape_params(spec: StudySpec) -> list[str]:
    """The space's parameters that fix a fused array's shape (its members must agree on them).

    Example:
        >>> from search.specs.schema import parse_spec
        >>> spec = parse_spec({"study": "s", "trainable": "torch_cnn",
        ...     "objective": {"metric": "val_loss", "mode": "min"},
        ...     "space": {"lr": {"loguniform": [1e-4, 1e-2]},
        ...               "batch_size": {"int": [32, 256]},
        ...               "precision": {"choice": ["fp32", "bf16"]}}})
        >>> shape_params(spec)                      # a choice of batch sizes would not split
        ['batch_size', 'precision']
    """
    per_member = set(importlib.import_module(PER_MEMBER_AT).FUSED_PER_MEMBER)
    if micro_batch(spec) is not None:  # batch sizes of a common divisor share an array
        per_member.add("batch_size")
    return [name for name in spec.space if name not in per_member]


def choice(fused: Mapping[int, float], unfused: float) -> tuple[int | None, str]:
    """The members an array takes, or ``None`` to run unfused, and why in words."""
    shown = ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(fused.items()))
    if not fused or unfused <= 0:
        return None, f"off: not measured (array images/s {shown or 'none'}, unfused {unfused:,.0f})"
    members = choose(fused, TOLERANCE)
    ratio = fused[members] / unfused
    said = (
        f"images/s of one array by members on one GPU: {shown}; unfused trials on it {unfused:,.0f}"
    )
    if members < 2 or ratio < 1.0 + MARGIN:
        return None, f"off: {said}; the best array is {ratio:.2f}x, under {1 + MARGIN:.1f}x"
    return members, f"{members} trials an array: {said} ({ratio:.2f}x)"


def array_rates(
    spec: StudySpec, data: SharedData, config: Mapping[str, Any], cap: int
) -> dict[int, float]:
    """The array's images per second by members, measured in one fresh Ray task on one GPU
    (``{}`` when the task failed: unfused then)."""
    import ray

    build = builder(spec.trainable) or ""  # decide_fuse asks only for a trainable that fuses
    defaults = dict(declared_defaults(spec.trainable) or {})
    more: Callable[[dict[int, float]], int | None] = functools.partial(
        _next, cap=cap
    )  # next_count with the cap, picklable
    task = ray.remote(num_cpus=1, num_gpus=1, max_retries=0, max_calls=1)(_measure)
    try:
        rates: dict[int, float] = ray.get(task.remote(build, data.ref, config, more, defaults))
    except Exception as exc:  # the array did not train on this GPU: unfused
        why = one_line(exc, where="last")
        print(f"fuse auto: the array's measurement failed ({why})", file=sys.stderr)
        return {}
    return rates


def _next(rates: dict[int, float], cap: int) -> int | None:
    return next_count(rates, cap, TOLERANCE)


def _measure(
    build: str, data: Any, config: Mapping[str, Any], more: Any, defaults: Mapping[str, Any]
) -> dict[int, float]:
    measure = resolve_function(RATES)
    return dict(measure(resolve_function(build), data, config, more, defaults))


def packed_rate(
    spec: StudySpec, placement: Placement, data: SharedData, config: Mapping[str, Any]
) -> float:
    """Images per second of the unfused trials the spec packs on one GPU, measured."""
    share = placement.gpus_per_trial
    packed = max(1, round(1.0 / share)) if 0 < share < 1 else 1
    rates = measure_rates(spec, data, config, fit=packed, total_bytes=placement.total_gpu_bytes)
    return max(rates.values(), default=0.0)
