"""The process that trains a device's fused arrays for the trials that run on it (issue 44).

Each fused trial stays a Ray Tune trial of its own: its process runs a light proxy
(:mod:`search.tuning.fusion`) that joins a :class:`Host`, asks it for the member's next epoch
and reports it as any trial reports an epoch; ASHA, the bridge and the record see a trial
like any other. The host holds one :class:`~trainables.torch.fused_loop.FusedArray` of
``slots`` members per shape (:func:`~trainables.torch.fused_loop.array_key`) and trains an
array's epoch once every running member of it has asked (or :data:`GRACE_S` after the first
asked: a member whose trial was just stopped does not hold the others). A member that leaves
frees its slot, and the next trial of that shape takes it at once (continuous batching).

Calls come from many threads (a threaded Ray actor); one lock guards the arrays, and an epoch
trains while holding it (one device trains one array at a time).

Example (in one process, without Ray: two trials, one array):
    >>> from search.contract.dataset import load_digits
    >>> from trainables.torch.cnn import build_model
    >>> host = Host(build_model, load_digits(0.2, 0), slots=2)
    >>> for number, lr in ((0, 1e-3), (1, 3e-3)):
    ...     host.join(number, {"channels": 4, "lr": lr}, seed=number, max_epochs=1)
    >>> import threading
    >>> rows = {}
    >>> threads = [threading.Thread(target=lambda n=n: rows.update({n: host.next(n)}))
    ...            for n in (0, 1)]
    >>> for t in threads: t.start()
    >>> for t in threads: t.join()
    >>> [(rows[n][0]["array_members"], rows[n][1]) for n in (0, 1)]   # trained together, done
    [(2.0, True), (2.0, True)]
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from search import Dataset, Metrics, TrialContext
from trainables.knobs import CNN_DEFAULTS, read_config
from trainables.torch.fused_loop import FusedArray, array_key, fused_tensors

GRACE_S = 1.0
"""How long an array's epoch waits for members that have not asked yet."""
WAIT_S = 0.05


@dataclass
class _Group:
    """One shape's array and who sits where."""

    array: FusedArray
    numbers: dict[int, int] = field(default_factory=dict)  # slot -> trial number
    waiting: set[int] = field(default_factory=set)
    since: float | None = None  # when the first of ``waiting`` asked
    results: dict[int, tuple[Metrics, bool]] = field(default_factory=dict)

    def free_slot(self) -> int | None:
        return next((k for k in range(self.array.k) if k not in self.numbers), None)


class Host:
    """A device's fused arrays, for the trials that join it.

    Args:
        build_model: The model builder, ``build_model(cfg, tensors)`` (an ``nn.Sequential``).
        data: The study's dataset (every member trains on it).
        slots: The most members of one array (``resources.fuse``).
        threads: CPU threads the host trains with.
        device: ``cpu`` or ``cuda``.
        defaults: The built-in's knobs with their defaults (a member's config is filled so).
        micro_batch: The images a step takes from each member; a member whose batch size is
            a multiple of it joins the array of that micro-batch (``None``: each batch size
            an array of its own).
    """

    def __init__(
        self,
        build_model: Callable[[Mapping[str, Any], Any], Any],
        data: Dataset,
        slots: int,
        threads: int = 1,
        device: str = "cpu",
        defaults: Mapping[str, Any] = CNN_DEFAULTS,
        micro_batch: int | None = None,
    ) -> None:
        torch.set_num_threads(max(1, threads))
        if device == "cuda" and not torch.cuda.is_available():  # a logical GPU of Ray's
            print("the fused host holds a GPU of Ray's, but PyTorch sees no CUDA device: "
                  "training on the CPU", file=sys.stderr)  # fmt: skip
            device = "cpu"
        self.build = build_model
        self.tensors = fused_tensors(data, device)
        self.slots, self.defaults, self.micro = slots, defaults, micro_batch
        self.groups: dict[tuple[tuple[str, str], ...], _Group] = {}
        self.members: dict[int, tuple[_Group, int]] = {}
        self.lock = threading.Condition()

    def join(self, number: int, config: Mapping[str, Any], seed: int, max_epochs: int) -> None:
        """Trial ``number`` takes a slot of its shape's array (waiting for one to free)."""
        cfg = read_config(config, self.defaults)
        if cfg["precision"] == "fp16":
            raise ValueError(
                "a fused array trains fp32 or bf16 (fp16 needs a loss scale per member): "
                "set resources.fuse: off for fp16 trials"
            )
        ctx = TrialContext(max_epochs=max_epochs, seed=seed, trial_number=number)
        key = array_key(cfg, self.micro)
        self.leave(number)  # a retried trial starts again: its earlier attempt's slot frees
        with self.lock:
            while True:
                group = self.groups.get(key)
                if group is None:
                    members = [(cfg, ctx)] * self.slots
                    array = FusedArray(self.build, self.tensors, members, self.micro)
                    group = self.groups[key] = _Group(array)
                    for k in range(1, self.slots):
                        array.vacate(k)  # copies of the first member, until trials come
                    slot = 0
                    break
                free = group.free_slot()
                if free is not None:
                    group.array.assign(free, cfg, ctx)
                    slot = free
                    break
                self.lock.wait(WAIT_S)
            group.numbers[slot] = number
            self.members[number] = (group, slot)

    def next(self, number: int) -> tuple[Metrics, bool] | None:
        """Trial ``number``'s next epoch: its metrics and whether it was its last (``None``
        when the trial left meanwhile)."""
        with self.lock:
            if number not in self.members:
                return None
            group, slot = self.members[number]
            if group.array.done(slot):
                return None  # its last epoch was answered already
            group.waiting.add(slot)
            group.since = group.since or time.monotonic()
            while slot not in group.results:
                if self.members.get(number) != (group, slot):
                    return None
                running = set(group.array.running())
                late = time.monotonic() - (group.since or 0.0) > GRACE_S
                if running <= group.waiting or late:
                    self._train(group, running)
                else:
                    self.lock.wait(WAIT_S)
            return group.results.pop(slot)

    def _train(self, group: _Group, running: set[int]) -> None:
        ready = group.waiting & running
        group.waiting -= ready
        group.since = time.monotonic() if group.waiting else None
        for slot, row in group.array.epoch(only=ready).items():
            group.results[slot] = (row, group.array.done(slot))
        self.lock.notify_all()

    def leave(self, number: int) -> None:
        """Trial ``number`` ended (finished, pruned, failed or gone): its slot frees."""
        with self.lock:
            found = self.members.pop(number, None)
            if found is None:
                return
            group, slot = found
            group.array.vacate(slot)
            group.numbers.pop(slot, None)
            group.waiting.discard(slot)
            group.results.pop(slot, None)
            self.lock.notify_all()
