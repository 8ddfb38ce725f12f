"""The in-process sampler benchmark's two measures and its report
(``benchmarks/sampler_settings.py``): the incumbent (the config with the best *reported*
loss, as a user picks it) and the best config evaluated (the best *true* mean loss), which
part when a noisy report makes a worse config the incumbent."""

from __future__ import annotations

from typing import Any

from benchmarks.functions import FUNCTIONS
from benchmarks.sampler_settings import SEQUENTIAL, best_seen, incumbent
from benchmarks.sampler_settings_report import report

H6 = FUNCTIONS["hartmann6"]


def test_the_best_config_evaluated_is_not_the_incumbent_when_a_report_misleads() -> None:
    f = H6.best_loss
    # (end time, reported loss, true mean loss) per finished trial, in order of finishing
    done = [
        (1.0, f + 1.0, f + 1.0),
        (2.0, f + 0.5, f + 0.01),
        (3.0, f + 0.1, f + 2.0),  # a lucky report: a bad config becomes the incumbent
        (4.0, f + 3.0, f + 0.001),  # an unlucky one: the best config is not picked
    ]
    means = [m for _, _, m in done]
    assert incumbent(H6, done) == [H6.log_regret(means[i]) for i in (0, 1, 2, 2)]
    assert best_seen(H6, done) == [H6.log_regret(means[i]) for i in (0, 1, 1, 3)]


def _run(sampler: str, k: int, seed: int, regret: float, seen: float | None) -> dict[str, Any]:
    run: dict[str, Any] = {
        "task": "hartmann6",
        "sampler": sampler,
        "k": k,
        "space": "index",
        "seed": seed,
        "trials": 25,
        "regret": [regret] * 25,
        "end": [float(i) for i in range(1, 26)],
    }
    if seen is not None:
        run["best_seen"] = [seen] * 25
    return run


def _within_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| auto x16 | ") and "/" in line]


def test_the_report_counts_the_tables_by_both_measures_when_the_runs_hold_both() -> None:
    # auto's incumbent is a decade behind sequential TPE's; the best configs it evaluated
    # are level with sequential TPE's.
    runs = [_run(SEQUENTIAL, 1, s, -2.0, -2.0) for s in range(3)]
    runs += [_run("auto", 16, s, -1.0, -2.0) for s in range(3)]
    text = report(runs)
    assert "by the best config evaluated" in text
    by_incumbent, by_best_seen = _within_rows(text)
    assert by_incumbent.split(" | ")[1] == "0/1" and by_best_seen.split(" | ")[1] == "1/1"

    runs[-1].pop("best_seen")  # an older file's run, written before the measure existed
    text = report(runs)
    assert "by the best config evaluated" not in text
    assert len(_within_rows(text)) == 1


def test_the_figures_draw_each_contenders_median_curve_per_table_and_k(tmp_path) -> None:
    from benchmarks.sampler_settings import PEER
    from benchmarks.sampler_settings_figures import figure, write

    runs = [_run(SEQUENTIAL, 1, s, -2.0, None) for s in range(3)]
    for k in (1, 16):
        runs += [_run("auto", k, s, -1.0 - s, None) for s in range(3)]  # median: seed 1's
        runs += [_run(PEER, k, s, -0.5, None) for s in range(2)]
    runs += [{**r, "task": "other"} for r in runs]
    (ax, _) = figure(runs, 16).axes
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines == {
        "auto x16": [-2.0] * 25,
        f"{PEER} x16": [-0.5] * 25,
        "optuna-tpe, 1 at a time": [-2.0] * 25,
    }
    # at K = 1, Optuna's own TPE is sequential TPE: drawn once
    assert {line.get_label() for line in figure(runs, 1).axes[0].get_lines()} == {
        "auto x1",
        "optuna-tpe, 1 at a time",
    }
    paths = write(runs, tmp_path / "png")
    assert [p.name for p in paths] == ["regret-x1.png", "regret-x16.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
