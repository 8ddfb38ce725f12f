"""The command line: ``run``, ``trials``, ``logs``, ``dashboard``, ``export``, ``report``,
``train``, ``check``, ``register`` and ``slurm``.

The top layer: it calls :mod:`search.handover`, :mod:`search.report` and :mod:`search.tuning`.
Those modules import Ray, Optuna or PyTorch when they are imported, so each command imports
what it needs inside its function, and ``--help`` stays instant. Every error a user can fix
ends in one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from search.errors import SearchError, disk_full, one_line
from search.specs.schema import DEFAULT_STORAGE
from search.tuning import terminal

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Hyperparameter search for deep learning: Optuna proposes, Ray Tune runs, ASHA prunes.",
)
console = terminal.console()
F = TypeVar("F", bound=Callable[..., Any])
IMPORTED = time.monotonic()
"""When this module was imported: the command's start where the process's own is unknown."""


def command_seconds() -> float:
    """Seconds since this process started (the command's wall time, its imports, checks and
    Ray's start included); since this module's import without ``psutil``."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except (ImportError, OSError):
        return time.monotonic() - IMPORTED


def one_line_errors(fn: F) -> F:
    """Turns a :class:`SearchError` into ``error: <message>`` on stderr and exit status 2, and
    so a full disk, naming the command's ``--storage`` or ``--results`` when it is on it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with full_disk_is_one_line(kwargs.get("storage"), kwargs.get("results")):
                return fn(*args, **kwargs)
        except SearchError as exc:
            typer.echo(f"error: {one_line(str(exc))}", err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def full_disk_is_one_line(*places: str | Path | None) -> Iterator[None]:
    """Turns an error whose cause is a full disk into a
    :class:`~search.errors.DiskFullError` naming the file or the first full one of
    ``places`` (storage URLs and folders the command writes to)."""
    try:
        yield
    except Exception as exc:
        if disk_full(exc) is None:
            raise
        from search.record.storage import full_disk_error

        error = full_disk_error(exc, [str(place) for place in places if place])
        raise (error or exc) from None


StorageOpt = Annotated[str, typer.Option(help="Optuna storage URL; ${VAR} reads the environment.")]
AddressOpt = Annotated[
    str | None,
    typer.Option(
        help="Ray cluster to join (else a local Ray of the run's own).", envvar="RAY_ADDRESS"
    ),
]


# Options that export and register share.
ModelName = Annotated[
    str | None, typer.Option(help="The registered model's name (default: the study's).")
]
Promote = Annotated[
    bool,
    typer.Option(
        "--promote",
        help="Move alias champion to the new version when it beats the champion by more than "
        "one standard error.",
    ),
]


@app.command()
@one_line_errors
def run(
    spec: Annotated[Path, typer.Argument(help="The study's YAML spec.")],
    trials: Annotated[int | None, typer.Option(help="Override budget.trials.")] = None,
    max_epochs: Annotated[int | None, typer.Option(help="Override budget.max_epochs.")] = None,
    study: Annotated[str | None, typer.Option(help="Override the study name.")] = None,
    storage: Annotated[str | None, typer.Option(help="Override the storage URL.")] = None,
    results: Annotated[Path, typer.Option(help="Folder for results.")] = Path("results"),
    seed: Annotated[int | None, typer.Option(help="Override sampler.seed.")] = None,
    address: AddressOpt = None,
    verbose: Annotated[int, typer.Option(help="Ray Tune's own verbosity (0-3).")] = 0,
    restart: Annotated[
        bool, typer.Option("--restart", help="Delete the study and start afresh.")
    ] = False,
    takeover: Annotated[
        bool, typer.Option("--takeover", help="Take the study over from a driver that is dead.")
    ] = False,
) -> None:
    """Run a study: sample configs, train them as Ray Tune trials, record them in Optuna."""
    from search.specs.schema import load_spec, with_overrides
    from search.tuning.preflight import check_run

    parsed = with_overrides(
        load_spec(spec),
        source=f"{spec} (with command-line options)",
        **{
            "budget.trials": trials,
            "budget.max_epochs": max_epochs,
            "study": study,
            "storage": storage,
            "sampler.seed": seed,
        },
    )
    # A built-in's knobs, storage, data and the Ray cluster: one line and exit 2 now, not a hang
    # or a traceback later.
    check_run(
        parsed,
        address,
        storage_field="--storage" if storage else f"{spec}: storage",
        data_field=f"{spec}: data",
        source=str(spec),
    )
    # Ray Tune comes with the runner (over a second to import): after the checks, so a spec
    # they refuse costs none of it.
    from search.record.lease import TAKEN_EXIT_STATUS, StudyTakenError
    from search.record.study import load_study
    from search.report.after_run import after_run
    from search.tuning.runner import RunOptions, run_study
    from search.tuning.signals import EXIT_STATUS, INTERRUPT_EXIT_STATUS

    options = RunOptions(
        results_dir=results,
        address=address,
        verbose=verbose,
        restart=restart,
        takeover=takeover,
        source=str(spec),
    )
    try:
        with full_disk_is_one_line(parsed.storage, results):
            summary = run_study(parsed, options)
        with ray_stopping_behind():  # the results and the report need only the study
            done = load_study(parsed.study, parsed.storage)
            # the wall time the user waited, from the command's start, not the runner's
            after_run(console, done, parsed, replace(summary, seconds=command_seconds()), results)
    except StudyTakenError as exc:  # another driver runs the study now: it is not ours to end
        typer.echo(f"error: {one_line(str(exc))}", err=True)
        raise typer.Exit(TAKEN_EXIT_STATUS) from None
    except KeyboardInterrupt:  # Ctrl-C outside Tune's loop, or a second one inside it
        typer.echo("stopped at once by Ctrl-C; the same command continues the study", err=True)
        raise typer.Exit(INTERRUPT_EXIT_STATUS) from None
    if summary.terminated:  # as a shell reports a process SIGTERM ended (search/tuning/signals.py)
        typer.echo(
            "stopped by SIGTERM; the same command continues the study, its cut trials replaced",
            err=True,
        )
        raise typer.Exit(EXIT_STATUS)
    if summary.interrupted_by_user:  # Ctrl-C: its line came at once (search/tuning/signals.py)
        raise typer.Exit(INTERRUPT_EXIT_STATUS)
    if summary.stopped_early:
        typer.echo(
            f"error: {summary.stopped_early}; fix it and run again (the run stopped "
            "early, before its budget)",
            err=True,
        )
        raise typer.Exit(2)
    if summary.states and "COMPLETE" not in summary.states.values():
        _no_trial_completed(done, summary.states)


def _no_trial_completed(study: Any, states: dict[int, str]) -> None:
    """One line and exit 1 when every trial of this run was pruned or failed."""
    from search.report.after_run import no_trial_completed

    typer.echo(f"error: {no_trial_completed(study, states)}", err=True)
    raise typer.Exit(1)


@app.command("trials")
@one_line_errors
def trials_cmd(
    study: Annotated[str, typer.Argument(help="Study name.")],
    storage: StorageOpt = DEFAULT_STORAGE,
    metrics: Annotated[
        str, typer.Option(help="Metrics to show beside the objective: a,b or all.")
    ] = "",
) -> None:
    """Print a study's trials as a table."""
    from search.record.study import load_study
    from search.report.console import print_trials
    from search.tuning.preflight import check_storage

    check_storage(storage, "--storage")
    names = [m.strip() for m in metrics.split(",") if m.strip()]
    print_trials(console, load_study(study, storage), names)


@app.command()
@one_line_errors
def logs(
    study: Annotated[str, typer.Argument(help="Study name.")],
    trial: Annotated[int, typer.Argument(help="Trial number.")],
    storage: StorageOpt = DEFAULT_STORAGE,
    follow: Annotated[
        bool, typer.Option("--follow", help="Go on printing until the trial stops running.")
    ] = False,
    rank: Annotated[
        int,
        typer.Option(
            min=0,
            help="The process of a data-parallel trial (0 reports; N writes output.rankN.log).",
        ),
    ] = 0,
) -> None:
    """Print a trial's stdout and stderr (its output.log, named by user_attrs.log)."""
    from search.record.study import load_study
    from search.report.logs import print_log
    from search.tuning.preflight import check_storage

    check_storage(storage, "--storage")
    print_log(load_study(study, storage), trial, follow=follow, rank=rank)


@app.command()
@one_line_errors
def dashboard(
    storage: StorageOpt = DEFAULT_STORAGE,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    results: Annotated[Path, typer.Option(help="Folder for results.")] = Path("results"),
) -> None:
    """Serve optuna-dashboard on the storage (loopback only unless --host says otherwise)."""
    from search.record.storage import redact
    from search.report.dashboard import is_loopback, port_is_free, serve
    from search.tuning.preflight import check_storage

    if not is_loopback(host):
        typer.echo(
            f"warning: serving on {host}: optuna-dashboard has no authentication; anyone who "
            "can reach this port can read and change the studies",
            err=True,
        )
    if not port_is_free(host, port):
        raise SearchError(f"--port: {host}:{port} is already in use; pick another port")
    check_storage(storage, "--storage")
    typer.echo(f"optuna-dashboard on http://{host}:{port} for {redact(storage)}", err=True)
    serve(storage, host, port, results)


@contextlib.contextmanager
def ray_stopping_behind() -> Iterator[None]:
    """Shuts Ray down in a thread (its processes stop one by one, a second or more) while
    the body runs, and waits for it at the end.

    Ray's objects (an ``ObjectRef``, an actor handle) call into Ray's core when they are
    freed, and one freed while Ray shuts down ends the process at once (exit status 1, "The
    core worker has already been shutdown"). So the garbage Tune left in reference cycles is
    collected first, while Ray is up, and the cycle collector stays off until Ray is down:
    the body drops no Ray object of its own."""
    import ray

    gc.collect()
    gc.disable()
    stopping = threading.Thread(target=ray.shutdown, name="search-ray-stop", daemon=True)
    stopping.start()
    try:
        yield
    finally:
        stopping.join()
        gc.enable()


@app.command()
@one_line_errors
def export(
    study: Annotated[str, typer.Argument(help="Study name.")],
    storage: StorageOpt = DEFAULT_STORAGE,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Bundle folder (default results/<study>/export; with --pareto "
            "results/<study>/export/pareto)."
        ),
    ] = None,
    top_k: Annotated[int, typer.Option(min=1, help="Configs to confirm.")] = 3,
    seeds: Annotated[int, typer.Option(min=1, help="Fresh seeds per config.")] = 3,
    results: Annotated[Path, typer.Option(help="Folder for results.")] = Path("results"),
    address: AddressOpt = None,
    pareto: Annotated[
        bool,
        typer.Option(
            "--pareto",
            help="Several objectives: confirm every Pareto-optimal config, one bundle each, "
            "and an index (pareto.csv, PARETO.md, pareto.png).",
        ),
    ] = False,
    pick: Annotated[
        str | None,
        typer.Option(
            help="Export the one trial these constraints choose, e.g. 'latency_ms<5' "
            "(<, <=, >, >=; comma-separated): the best on the primary objective among "
            "the Pareto front's trials (every COMPLETE trial with one objective) that "
            "satisfy them.",
        ),
    ] = None,
    mlflow: Annotated[
        str | None,
        typer.Option(
            help="Register the winner (each Pareto point) in this MLflow registry: a server "
            "URL, sqlite:///mlflow.db or a folder; alias challenger.",
        ),
    ] = None,
    model_name: ModelName = None,
    promote: Promote = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="With --mlflow: retrain and replace the bundle already in the folder "
            "(without it, export refuses; `register` registers that bundle as it is).",
        ),
    ] = False,
) -> None:
    """Confirm the top configs with fresh seeds, retrain the winner, write a model bundle."""
    from search.handover.deliver import deliver
    from search.tuning.preflight import check_storage

    check_storage(storage, "--storage")
    log = functools.partial(console.print, markup=False)
    deliver(
        study, storage, out, top_k, seeds, address, results, log,
        pareto=pareto, pick=pick, mlflow=mlflow, model_name=model_name, promote=promote,
        overwrite=overwrite,
    )  # fmt: skip


@app.command()
@one_line_errors
def report(
    study: Annotated[str, typer.Argument(help="Study name.")],
    storage: StorageOpt = DEFAULT_STORAGE,
    results: Annotated[Path, typer.Option(help="Folder for results.")] = Path("results"),
) -> None:
    """Write results/<study>/report.html (offline plotly figures) and figures/*.png."""
    from search.record.study import load_study
    from search.report.dashboard import publish_study
    from search.report.html import report_study
    from search.tuning.preflight import check_storage

    check_storage(storage, "--storage")
    loaded = load_study(study, storage)
    console.print(f"report {report_study(loaded, results)}")
    publish_study(loaded, results)  # the dashboard's note and trial artifacts


@app.command()
@one_line_errors
def train(
    spec: Annotated[Path, typer.Argument(help="A spec of fixed parameters (config.yaml).")],
    out: Annotated[
        Path | None, typer.Option(help="Save the model there through the export hook.")
    ] = None,
) -> None:
    """Train one config again, in this process, without Ray (export's config.yaml, best.yaml).

    When a metrics.json from export sits next to the spec, the result is compared with the
    exported metric; the command exits 1 when it is further away than the stated tolerance.
    """
    import json

    from search.handover.train import train_spec, will_import
    from search.specs.schema import load_spec

    parsed = load_spec(spec)
    console.print(will_import(parsed, str(spec)), markup=False)
    metric = parsed.primary.metric
    final = train_spec(parsed, out, log=lambda line: console.print(line, markup=False))
    console.print(f"{metric} {final[metric]:.4f}")
    exported = spec.parent / "metrics.json"
    if exported.exists():
        saved = json.loads(exported.read_text())
        target, tolerance = float(saved["final"][metric]), float(saved["tolerance"])
        diff = abs(final[metric] - target)
        verdict = "reproduces" if diff <= tolerance else "does NOT reproduce"
        console.print(
            f"{verdict} the exported {metric} {target:.4f} "
            f"(difference {diff:.4f}, tolerance {tolerance})"
        )
        if diff > tolerance:
            raise typer.Exit(1)


@app.command()
@one_line_errors
def register(
    bundle: Annotated[Path, typer.Argument(help="An export bundle folder, as export wrote it.")],
    mlflow: Annotated[
        str,
        typer.Option(
            help="The MLflow registry: a server URL, sqlite:///mlflow.db or a folder; alias "
            "challenger.",
            envvar="MLFLOW_TRACKING_URI",  # as MLflow's own tools read it
        ),
    ],
    model_name: ModelName = None,
    promote: Promote = False,
) -> None:
    """Register a bundle as it is, without retraining: check it, then log and register it.

    The bundle check of `check` runs first; a bundle it rejects is refused (exit 2) and
    nothing is registered."""
    from search.handover.register import register_checked

    log = functools.partial(console.print, markup=False)
    register_checked(bundle, mlflow, model_name, promote, log)


@app.command()
@one_line_errors
def check(
    bundle: Annotated[
        str, typer.Argument(help="An export bundle folder (model.onnx), or models:/name@alias.")
    ],
    mlflow: Annotated[
        str | None,
        typer.Option(help="The MLflow registry of a models:/ URI.", envvar="MLFLOW_TRACKING_URI"),
    ] = None,
) -> None:
    """Run a bundle's model.onnx with onnxruntime on its declared inputs; no trainable imported.

    A ``models:/name@alias`` (or ``models:/name/N``) is loaded from the ``--mlflow`` registry
    with ``mlflow.pyfunc.load_model`` and scored on its bundle's validation data."""
    from search.handover.check import BundleCheckFailed, check_bundle

    try:
        if bundle.startswith("models:/"):
            from search.handover.registry import Target
            from search.handover.registry_check import check_registered

            if mlflow is None:
                raise SearchError(
                    f"{bundle}: give the registry with --mlflow URI (or MLFLOW_TRACKING_URI)"
                )
            lines = check_registered(bundle, Target(uri=mlflow, model_name="-"))
        else:
            lines = check_bundle(Path(bundle))
    except BundleCheckFailed as exc:
        for line in exc.lines:
            console.print(line, markup=False)
        typer.echo(f"MISMATCH: {one_line(str(exc))}", err=True)
        raise typer.Exit(1) from None
    for line in lines:
        console.print(line, markup=False)


@app.command()
@one_line_errors
def slurm(
    spec: Annotated[Path, typer.Argument(help="The study's YAML spec.")],
    nodes: Annotated[int, typer.Option(help="Nodes: Ray's head on the first.")] = 1,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs on each node.")] = None,
    cpus_per_node: Annotated[int | None, typer.Option(help="CPUs on each node.")] = None,
    time: Annotated[
        str | None, typer.Option(help="Time limit, as sbatch reads it (90, 2:00:00, 1-12).")
    ] = None,
    partition: Annotated[str | None, typer.Option(help="sbatch --partition.")] = None,
    account: Annotated[str | None, typer.Option(help="sbatch --account.")] = None,
    requeue: Annotated[
        bool, typer.Option("--requeue", help="Requeue the job when its time limit stops it.")
    ] = False,
    grace: Annotated[
        int, typer.Option(help="Seconds before the time limit at which the study stops.")
    ] = 120,
    sbatch: Annotated[
        list[str] | None, typer.Option(help="More sbatch options, one #SBATCH line each.")
    ] = None,
    trials: Annotated[int | None, typer.Option(help="Override budget.trials.")] = None,
    study: Annotated[str | None, typer.Option(help="Override the study name.")] = None,
    storage: Annotated[str | None, typer.Option(help="Override the storage URL.")] = None,
    results: Annotated[
        Path, typer.Option(help="Folder for results, on the shared filesystem.")
    ] = Path("results"),
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the batch script; submit nothing.")
    ] = False,
) -> None:
    """Run a study as a SLURM batch job: Ray across the allocation, `search run` on its head."""
    from search.compute.slurm import SlurmJob, prepare, submit

    options = {"trials": trials, "study": study, "storage": storage, "results": results}
    job = SlurmJob(
        name="", nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_node=cpus_per_node,
        time=time, partition=partition, account=account, requeue=requeue, grace_s=grace,
        extra=tuple(sbatch or ()),
    )  # fmt: skip
    typed = " ".join(shlex.quote(a) for a in ["search", *sys.argv[1:]] if a != "--dry-run")
    script, text, watch = prepare(spec, job, options, typed)
    if dry_run:
        typer.echo(text, nl=False)
        return
    job_id = submit(script, text)
    for line in watch(job_id):
        typer.echo(line)


def main() -> None:
    """Entry point of ``python -m search`` and the ``search`` script."""
    # TensorFlow's C++ start-up notes (oneDNN, CUDA probing) are not the user's business; its
    # warnings and errors still show.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        app()
    except SystemExit as exc:
        _exit_now(exc.code)


def _exit_now(code: object) -> NoReturn:
    """Ends the process as the interpreter would, without its finalization.

    Threads still running are waited for, the exit hooks run (Ray's shutdown, logging's
    flush), the output is flushed; then the process ends. What is skipped is the interpreter
    tearing down every module and Ray's C++ core object by object, which took seconds after
    every ``run``, once every file was written and closed."""
    if isinstance(code, str):  # SystemExit("message"): the message, and status 1
        print(code, file=sys.stderr)
        code = 1
    pools = sys.modules.get("concurrent.futures.thread")
    if pools is not None:  # its idle workers wait for this hook (the interpreter's) to stop
        pools._python_exit()  # type: ignore[attr-defined]
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing left to say
            stream.flush()
    os._exit(code if isinstance(code, int) else 0)
