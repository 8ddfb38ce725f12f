"""The fate rules, driven by hand with fake results (no Ray, no training)."""

from __future__ import annotations

import math

from optuna.trial import TrialState

from search.contract import nonfinite_reason
from search.errors import error_summary
from search.tuning.fate import EPOCH, FAIL_REASON, NO_VALUE, TrialRecord


def _record(values: list[float], max_epochs: int = 9, **last: object) -> TrialRecord:
    record = TrialRecord("acc", max_epochs)
    for epoch, value in enumerate(values, start=1):
        record.add({"acc": value, EPOCH: epoch, "time_total_s": epoch * 0.5, **last})
    return record


def test_trained_to_the_end_is_complete_with_last_value() -> None:
    state, value, reason = _record([0.1, 0.5, 0.7], max_epochs=3).fate()
    assert (state, value, reason) == (TrialState.COMPLETE, 0.7, None)


def test_stopped_by_scheduler_before_budget_is_pruned() -> None:
    record = _record([0.1, 0.2])
    record.pruned = True
    assert record.fate()[0] == TrialState.PRUNED


def test_scheduler_stop_at_budget_is_complete() -> None:
    record = _record([0.1, 0.2, 0.3], max_epochs=3)
    record.pruned = True
    assert record.fate()[0] == TrialState.COMPLETE


def test_own_early_stop_is_complete() -> None:
    assert _record([0.1, 0.2]).fate()[0] == TrialState.COMPLETE


def test_nonfinite_is_fail_with_reason() -> None:
    record = _record([0.1, 0.2], **{FAIL_REASON: "val_loss is nan at epoch 2"})
    assert record.fate() == (TrialState.FAIL, None, "val_loss is nan at epoch 2")
    assert _record([0.1, math.inf]).fate()[0] == TrialState.FAIL


def test_error_and_nothing_reported_are_fail() -> None:
    record = _record([0.4])
    record.errored = True
    assert record.fate()[0] == TrialState.FAIL
    assert TrialRecord("acc", 3).fate()[2] == "no epoch reported"
    cut = TrialRecord("acc", 3, interrupted="time limit")
    assert cut.fate()[2] == "ended before its first epoch (time limit)"


def test_a_result_without_a_value_fails_the_trial_with_its_reason_and_no_curve() -> None:
    record = _record([0.3])
    reason = "metric acc missing at epoch 2 (got keys: accuracy)"
    assert record.add({"acc": math.nan, NO_VALUE: True, FAIL_REASON: reason, EPOCH: 2}) is None
    assert record.curve == {1: 0.3}
    assert record.fate() == (TrialState.FAIL, None, reason)


def test_one_value_per_epoch_even_when_result_repeats() -> None:
    record = _record([0.1, 0.2])
    assert record.add({"acc": 0.2, EPOCH: 2}) is None  # Ray repeats the last result at the end
    assert record.curve == {1: 0.1, 2: 0.2}
    assert record.user_attrs()["epochs"] == 2


def test_nonfinite_reason_and_error_summary() -> None:
    assert nonfinite_reason({"a": 1.0, "loss": float("-inf")}, 4) == "loss is -inf at epoch 4"
    assert nonfinite_reason({"a": 1.0}, 1) is None
    assert error_summary(ValueError("bad\nthings happened")) == "ValueError: things happened"


def test_stopped_from_outside_is_pruned_and_says_so() -> None:
    record = _record([0.1, 0.2])
    record.interrupted = "time limit"
    assert record.fate()[0] == TrialState.PRUNED
    assert record.user_attrs()["stopped_by"] == "time limit"
