"""How the driver scales: many trials, many results, big studies, and its start-up.

Modes (each prints its table, ratios against stock Ray Tune where it has a peer, and the truth
check of the record: trials left RUNNING/WAITING and curves that are not one intermediate value
per reported epoch):

    bookkeeping  N trials x 5 epochs x 0.2 s sleeping, 16 at once, ASHA off and on, on a local
                 Ray head (``ray start --head --num-cpus 64``, token auth) that the benchmark
                 starts and stops; ours vs stock Ray Tune (OptunaSearch TPE in memory +
                 ConcurrencyLimiter + reuse_actors) on the same head: wall / ideal
    throughput   32 trials at once, each reporting 20 results/s for 30 s: results recorded per
                 second, lag from a report to the driver and to the study, driver CPU share
    growth       ask/tell latency of the bridge (p50/p95) at 100/1k/5k/10k trials, TPE, on
                 SQLite (or ``--postgres URL``), the process's RSS; ``trials`` and ``report``
                 on the 10k-trial study (generated with Optuna directly)
    startup      ``python -m search run`` to its first reported epoch, phase by phase, against
                 Optuna in one process on the same trainable

    python benchmarks/scale.py bookkeeping --trials 400          # ~4 min here
    python benchmarks/scale.py bookkeeping                       # 2,000 trials
    python benchmarks/scale.py bookkeeping --trials 10000        # the opt-in 10k run
    python benchmarks/scale.py throughput --seconds 10
    python benchmarks/scale.py growth --sizes 100 1000
    python benchmarks/scale.py startup
    SCALE_PROFILE=/tmp/prof python benchmarks/scale.py bookkeeping --trials 300 --asha off
                                      # writes /tmp/prof.<contender>.<asha>, cProfile stats
    git archive HEAD search | tar -x -C /tmp/before
    SCALE_BEFORE=/tmp/before python benchmarks/scale.py bookkeeping --only before ours
    SCALE_SEARCH_TREE=/tmp/before python benchmarks/scale.py growth   # growth of that tree
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root holds ``benchmarks``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if os.environ.get("SCALE_SEARCH_TREE"):  # ``search`` from that tree (the "before" contender),
    sys.path.insert(0, os.environ["SCALE_SEARCH_TREE"])  # ahead of this repository's own

from benchmarks.scale_head import REPO, Head, driver_env  # noqa: E402

OUT = REPO / "results" / "benchmarks"
CONTENDERS = ("ours", "stock", "before")


def _contender(name: str, job: Any) -> dict[str, Any]:
    """Runs one contender's driver in its own process; returns its summary. ``before`` is ours
    from the tree in ``$SCALE_BEFORE`` (e.g. ``git archive HEAD search | tar -x -C DIR``),
    for its driver and its trials alike."""
    mine = {**asdict(job), "folder": f"{job.folder}/{name}"}  # a study and Ray folder each
    Path(mine["folder"]).mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, "--contender", name, "--job", json.dumps(mine)]
    env = driver_env()
    if name == "before":
        env["PYTHONPATH"] = f"{os.environ['SCALE_BEFORE']}{os.pathsep}{env['PYTHONPATH']}"
        env["SCALE_SEARCH_TREE"] = os.environ["SCALE_BEFORE"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{name} failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(lines[-1][len("RESULT ") :]))


def _side_by_side(jobs: list[Any], only: list[str]) -> list[dict[str, Any]]:
    rows = []
    for job in jobs:
        for name in only:
            row = {"contender": name, **_contender(name, job)}
            print(
                f"  {name:<6} asha={int(job.asha)} {row['wall_s']:8.1f} s",
                file=sys.stderr,
                flush=True,
            )
            rows.append(row)
    return rows


def _truth_line(row: dict[str, Any]) -> str:
    ok = row["open"] == 0 and row["wrong_curves"] == 0
    return (
        f"{'ok' if ok else 'NOT TRUTHFUL'}: {row['trials_recorded']} trials, "
        f"{row['open']} open, {row['wrong_curves']} curves off"
    )


def bookkeeping(args: argparse.Namespace, head: Head, folder: str) -> None:
    from benchmarks.scale_runs import Job

    jobs = [
        Job(args.trials, 5, 0.2, 16, asha, head.address, f"{folder}/{asha}", not args.no_ckpt)
        for asha in {"off": (False,), "on": (True,), "both": (False, True)}[args.asha]
    ]
    rows = _side_by_side(jobs, args.only)
    print(f"\nbookkeeping: {args.trials} trials x 5 epochs x 0.2 s, 16 at once")
    print(
        f"{'contender':<8} {'asha':>4} {'wall s':>8} {'ideal s':>8} {'x ideal':>8} "
        f"{'actors':>6} {'drv cpu s':>9}  record"
    )
    for row in rows:
        ratio = row["wall_s"] / row["ideal_s"]
        print(
            f"{row['contender']:<8} {int(row['asha']):>4} {row['wall_s']:>8.1f} "
            f"{row['ideal_s']:>8.1f} {ratio:>8.2f} {row['actors']:>6} "
            f"{row['driver_cpu_share'] * row['wall_s']:>9.1f}  {_truth_line(row)}"
        )
    _ratios(rows, "wall_s")
    _save("scale_bookkeeping.json", rows)


def throughput(args: argparse.Namespace, head: Head, folder: str) -> None:
    from benchmarks.scale_runs import Job

    epochs = int(20 * args.seconds)
    job = Job(32, epochs, 0.05, 32, False, head.address, folder, not args.no_ckpt)
    rows = _side_by_side([job], args.only)
    print(f"\nthroughput: 32 trials at once, 20 results/s each for {args.seconds:.0f} s")
    print(
        f"{'contender':<8} {'results/s':>9} {'drv lag p50/p95 s':>18} "
        f"{'study lag p50/p95 s':>20} {'driver CPU':>10}  record"
    )
    for row in rows:
        print(
            f"{row['contender']:<8} {row['results_per_s']:>9.0f} "
            f"{row['driver_lag_p50_s']!s:>8}/{row['driver_lag_p95_s']!s:<9} "
            f"{row['study_lag_p50_s']!s:>9}/{row['study_lag_p95_s']!s:<10} "
            f"{row['driver_cpu_share']:>10.0%}  {_truth_line(row)}"
        )
    _ratios(rows, "results_per_s")
    _save("scale_throughput.json", rows)


def _ratios(rows: list[dict[str, Any]], key: str) -> None:
    ours = [r for r in rows if r["contender"] == "ours"]
    for other in ("stock", "before"):
        theirs = [r for r in rows if r["contender"] == other]
        for o, t in zip(ours, theirs, strict=False):
            print(f"  ours / {other} {key} (asha={int(o['asha'])}): {o[key] / t[key]:.2f}")


def _save(name: str, rows: list[dict[str, Any]]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / name).write_text(json.dumps(rows, indent=1))
    print(f"wrote {OUT / name}")


def _run_contender(name: str, job_json: str) -> None:
    from benchmarks.scale_runs import Job, run_ours, run_stock

    job = Job(**json.loads(job_json))
    profile = os.environ.get("SCALE_PROFILE")  # a cProfile of this driver, for pstats/snakeviz
    if profile:
        import cProfile

        with cProfile.Profile() as prof:
            found = run_stock(job) if name == "stock" else run_ours(job)
        prof.dump_stats(f"{profile}.{name}.{int(job.asha)}")
    else:
        found = run_stock(job) if name == "stock" else run_ours(job)
    print("RESULT " + json.dumps(found), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "mode", nargs="?", choices=("bookkeeping", "throughput", "growth", "startup")
    )
    parser.add_argument("--trials", type=int, default=2000, help="bookkeeping trials")
    parser.add_argument("--seconds", type=float, default=30.0, help="throughput duration")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 5000, 10000])
    parser.add_argument("--postgres", help="growth on this PostgreSQL URL instead of SQLite")
    parser.add_argument("--probe", type=int, default=20, help="growth: trials asked per size")
    parser.add_argument("--only", nargs="+", choices=CONTENDERS, default=["ours", "stock"])
    parser.add_argument("--asha", choices=("off", "on", "both"), default="both")
    parser.add_argument("--no-ckpt", action="store_true", help="ours with faults.checkpoints off")
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender:
        _run_contender(args.contender, args.job)
        return
    if args.mode == "growth":
        from benchmarks import scale_growth

        scale_growth.main(args)
        return
    if args.mode == "startup":
        from benchmarks import scale_startup

        scale_startup.main(args)
        return
    with tempfile.TemporaryDirectory(prefix="scale-") as folder, Head(64) as head:
        (bookkeeping if args.mode == "bookkeeping" else throughput)(args, head, folder)


if __name__ == "__main__":
    main()
