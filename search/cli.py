"""The command line: ``run``, ``trials`` and ``dashboard``.

Heavy imports (Ray, Optuna, PyTorch) happen inside the commands, so ``--help`` is instant.
Every error a user can fix ends in one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from search.errors import SearchError
from search.spec import DEFAULT_STORAGE

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Hyperparameter search for deep learning: Optuna proposes, Ray Tune runs, ASHA prunes.",
)
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
F = TypeVar("F", bound=Callable[..., Any])


def one_line_errors(fn: F) -> F:
    """Turns a :class:`SearchError` into ``error: <message>`` on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SearchError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


StorageOpt = Annotated[str, typer.Option(help="Optuna storage URL; ${VAR} reads the environment.")]


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
    address: Annotated[str | None, typer.Option(help="Ray cluster to join.")] = None,
    verbose: Annotated[int, typer.Option(help="Ray Tune's own verbosity (0-3).")] = 0,
    restart: Annotated[
        bool, typer.Option("--restart", help="Delete the study and start afresh.")
    ] = False,
) -> None:
    """Run a study: sample configs, train them as Ray Tune trials, record them in Optuna."""
    from search.results import write_results
    from search.runner import RunOptions, run_study
    from search.spec import load_spec, with_overrides
    from search.study import load_study
    from search.summary import print_summary

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
    summary = run_study(
        parsed, RunOptions(results_dir=results, address=address, verbose=verbose, restart=restart)
    )
    done = load_study(parsed.study, parsed.storage)
    folder = write_results(done, parsed, results)
    print_summary(console, done, summary, folder)


@app.command("trials")
@one_line_errors
def trials_cmd(
    study: Annotated[str, typer.Argument(help="Study name.")],
    storage: StorageOpt = DEFAULT_STORAGE,
) -> None:
    """Print a study's trials as a table."""
    from search.study import load_study
    from search.summary import print_trials

    print_trials(console, load_study(study, storage))


@app.command()
@one_line_errors
def dashboard(
    storage: StorageOpt = DEFAULT_STORAGE,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
) -> None:
    """Serve optuna-dashboard on the storage (loopback only unless --host says otherwise)."""
    from search.dashboard import is_loopback, port_is_free, serve
    from search.storage import redact

    if not is_loopback(host):
        typer.echo(
            f"warning: serving on {host}: optuna-dashboard has no authentication; anyone who "
            "can reach this port can read and change the studies",
            err=True,
        )
    if not port_is_free(host, port):
        raise SearchError(f"--port: {host}:{port} is already in use; pick another port")
    typer.echo(f"optuna-dashboard on http://{host}:{port} for {redact(storage)}", err=True)
    serve(storage, host, port)


def main() -> None:
    """Entry point of ``python -m search`` and the ``search`` script."""
    app()
