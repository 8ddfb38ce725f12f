"""TPE's bounded history: the same draws as Optuna's TPE in a small study, a bounded cost in a
big one, with the running trials and the best ones always modelled."""

from __future__ import annotations

import optuna
import pytest
from optuna.study import StudyDirection
from optuna.trial import TrialState, create_trial

from search.record.sampling import history
from search.record.sampling.history import BoundedTPESampler, bounded

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def _objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -3.0, 3.0)
    kind = trial.suggest_categorical("kind", ["a", "b"])
    return (x - 1.0) ** 2 + (0.5 if kind == "a" else 0.0)


def _draws(sampler: optuna.samplers.BaseSampler, n: int) -> list[dict]:
    study = optuna.create_study(sampler=sampler)
    study.optimize(_objective, n_trials=n)
    return [t.params for t in study.trials]


def test_under_the_limit_it_samples_exactly_as_optunas_tpe() -> None:
    kwargs = {"seed": 3, "multivariate": True, "group": True, "n_startup_trials": 5}
    ours = _draws(BoundedTPESampler(history_limit=40, **kwargs), 40)
    theirs = _draws(optuna.samplers.TPESampler(**kwargs), 40)
    assert ours == theirs


def test_over_the_limit_it_keeps_the_running_the_best_and_the_recent() -> None:
    trials = []
    for number in range(100):
        state = TrialState.RUNNING if number in (3, 97) else TrialState.COMPLETE
        value = None if state == TrialState.RUNNING else float(number % 10 == 0) * number
        trial = create_trial(state=state, value=value)
        trial.number = number
        trials.append(trial)
    kept = bounded(trials, [StudyDirection.MAXIMIZE], limit=20)
    numbers = [t.number for t in kept]
    assert len(kept) == 20 and numbers == sorted(numbers)
    assert {3, 97} <= set(numbers)  # running: the constant liar needs them
    assert {90, 80, 70, 60, 50, 40, 30, 20, 10} <= set(numbers)  # the best, however old
    assert set(range(91, 100)) <= set(numbers)  # then the most recent
    assert bounded(trials, [StudyDirection.MAXIMIZE], limit=100) == trials


def test_a_big_study_is_modelled_on_at_most_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = history.bounded

    def spy(*args: object, **kwargs: object) -> list:
        out = real(*args, **kwargs)  # type: ignore[arg-type]
        seen.append(len(out))
        return out

    monkeypatch.setattr(history, "bounded", spy)
    study = optuna.create_study(sampler=BoundedTPESampler(seed=0, history_limit=30))
    study.optimize(_objective, n_trials=80)
    assert max(seen) == 30 and len(study.trials) == 80
    best = study.best_value
    assert best < 0.5  # still optimizes: x near 1 with kind b


def test_the_constant_liars_fresh_reads_are_bounded_and_see_the_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    picks: list[tuple[bool, int, set[int]]] = []  # (fresh read, trials read, numbers kept)
    real = history._Bounded._pick

    def spy(self: history._Bounded, trials: list, states: object, fresh: bool) -> list:
        out = real(self, trials, states, fresh)  # type: ignore[arg-type]
        picks.append((fresh, len(trials), {t.number for t in out}))
        return out

    monkeypatch.setattr(history._Bounded, "_pick", spy)
    sampler = BoundedTPESampler(seed=0, history_limit=30, constant_liar=True, n_startup_trials=5)
    study = optuna.create_study(sampler=sampler)
    study.optimize(_objective, n_trials=60)
    running = [study.ask() for _ in range(3)]  # parallel asks, each sampled while others run
    for trial in running:
        _objective(trial)
    fresh = [(read, kept) for is_fresh, read, kept in picks if is_fresh and read > 30]
    assert fresh and max(len(kept) for _, kept in fresh) <= 30 + len(running)
    assert {t.number for t in running} <= fresh[-1][1]  # the liar sees every running trial
