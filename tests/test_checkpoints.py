"""When a trial's saved state becomes a Tune checkpoint: not before ``checkpoint_every_s`` of
the attempt, then at most that often, and only when the state changed."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from search.contract import TrialContext
from search.tuning import worker


def _epochs(folder: Path, every_s: float, clock: list[float]) -> list[int]:
    """Epochs 1-6, one second apart, each saving new state; the ones that became checkpoints."""
    ctx = TrialContext(max_epochs=6, checkpoint_dir=str(folder))
    worker._SAVED[str(folder)] = ((), clock[0])  # the attempt starts
    made = []
    for epoch in range(1, 7):
        clock[0] += 1.0
        (folder / "state.json").write_text(str(epoch) * epoch)  # new state, a new size
        if worker._checkpoint(ctx, epoch, every_s) is not None:
            made.append(epoch)
    return made


@pytest.mark.parametrize(
    "every_s,expected",
    [(0.0, [1, 2, 3, 4, 5, 6]), (2.5, [3, 6]), (30.0, [])],  # 30 s: a short trial makes none
)
def test_checkpoints_wait_for_every_s_of_the_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every_s: float, expected: list[int]
) -> None:
    clock = [100.0]
    monkeypatch.setattr(worker.time, "monotonic", lambda: clock[0])
    assert _epochs(tmp_path, every_s, clock) == expected


def test_unchanged_state_makes_no_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks = itertools.count(100.0, 5.0)
    monkeypatch.setattr(worker.time, "monotonic", lambda: next(ticks))
    ctx = TrialContext(max_epochs=3, checkpoint_dir=str(tmp_path))
    (tmp_path / "state.json").write_text("1")
    assert worker._checkpoint(ctx, 1, 0.0) is not None
    assert worker._checkpoint(ctx, 2, 0.0) is None  # the trainable saved nothing new
