"""A study's results from Python: :class:`SearchResult`, what ``search.run`` returns and
:func:`load` gives for a study that exists (finished, or running elsewhere: read live).

Everything is read from the study's storage when asked, so a result of a study that another
driver still runs shows its trials as they are now. The methods do what the commands do:
:meth:`SearchResult.export` is ``python -m search export``, :meth:`SearchResult.report` is
``report``, :meth:`SearchResult.register` is ``register``.

Example:
    >>> result = load("nowhere", storage="sqlite:///:memory:")  # doctest: +SKIP
    search.record.study.StudyNotFoundError: ...
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.contract import receive
from search.handover.deliver import deliver
from search.handover.register import register_checked
from search.record.folders import study_folder
from search.record.queries import EPOCHS_FILE, best_trial, read_epochs, state_counts, trials_frame
from search.record.study import load_study, stored_spec
from search.report.dashboard import publish_study
from search.report.html import report_study
from search.specs.schema import DEFAULT_STORAGE
from search.tuning.preflight import check_storage
from search.tuning.terminal import console

if TYPE_CHECKING:
    import optuna
    import pandas as pd

    from search.specs.schema import StudySpec


class SearchResult:
    """A study, read live from its storage.

    Args:
        study: The study's name.
        storage: Its storage URL.
        results: The folder the run wrote its files under (``results/<study>/``).

    Attributes:
        study_name: The study's name.
        storage: Its storage URL (as given: it may hold a password; never printed).
        results: The results folder.
    """

    def __init__(self, study: str, storage: str, results: Path | str = "results") -> None:
        self.study_name, self.storage, self.results = study, storage, Path(results)
        self._study: optuna.Study | None = None

    @property
    def study(self) -> optuna.Study:
        """The ``optuna.Study`` itself (its trials are read from the storage at each call)."""
        if self._study is None:
            self._study = load_study(self.study_name, self.storage)
        return self._study

    @property
    def spec(self) -> StudySpec:
        """The spec the study was run with, as ``run`` stored it."""
        return stored_spec(self.study, self.storage, required=True)

    @property
    def best_trial(self) -> optuna.trial.FrozenTrial | None:
        """The best COMPLETE trial (``None`` before one completed)."""
        return best_trial(self.study)

    @property
    def best_config(self) -> dict[str, Any] | None:
        """The best trial's config: the spec's ``fixed`` knobs and the trial's parameters."""
        best = self.best_trial
        return None if best is None else {**self.spec.fixed, **best.params}

    @property
    def best_value(self) -> float | None:
        """The best trial's objective value (the first objective's, with several)."""
        best = self.best_trial
        return None if best is None or not best.values else float(best.values[0])

    @property
    def trials(self) -> pd.DataFrame:
        """One row per trial, the columns of ``trials.csv``."""
        return trials_frame(self.study)

    @property
    def curves(self) -> pd.DataFrame:
        """Each trial's metrics per epoch: columns ``trial``, ``epoch``, ``metric``,
        ``value``. Every metric of a finished trial (``epochs.csv``, where the run wrote it);
        the objective of the others, as the study holds it (a running trial's so far)."""
        import pandas as pd

        table = read_epochs(study_folder(self.results, self.study_name) / EPOCHS_FILE)
        rows = [
            (trial, epoch, metric, value)
            for trial, metrics in table.items()
            for metric, epochs in metrics.items()
            for epoch, value in epochs.items()
        ]
        objective = self.spec.primary.metric
        for t in self.study.get_trials(deepcopy=False):
            if t.number not in table:
                rows += [(t.number, e, objective, v) for e, v in t.intermediate_values.items()]
        frame = pd.DataFrame(rows, columns=["trial", "epoch", "metric", "value"])
        return frame.sort_values(["trial", "metric", "epoch"], ignore_index=True)

    def export(
        self,
        out: Path | str | None = None,
        *,
        top_k: int = 3,
        seeds: int = 3,
        address: str | None = None,
        pareto: bool = False,
        pick: str | None = None,
        mlflow: str | None = None,
        model_name: str | None = None,
        promote: bool = False,
        overwrite: bool = False,
    ) -> list[Path]:
        """``python -m search export``: confirms the top ``top_k`` configs with ``seeds``
        fresh seeds each, retrains the winner and writes its bundle (with ``mlflow``, also
        registers it); returns the bundle folders."""
        return deliver(
            self.study_name, self.storage, Path(out) if out else None, top_k, seeds, address,
            self.results, functools.partial(console().print, markup=False), pareto=pareto,
            pick=pick, mlflow=mlflow, model_name=model_name, promote=promote,
            overwrite=overwrite,
        )  # fmt: skip

    def report(self) -> Path:
        """``python -m search report``: writes ``report.html`` and the figures; its path."""
        path = report_study(self.study, self.results)
        publish_study(self.study, self.results)
        return path

    def register(
        self,
        bundle: Path | str,
        mlflow: str,
        model_name: str | None = None,
        promote: bool = False,
    ) -> str:
        """``python -m search register``: checks ``bundle`` and registers it as it is."""
        log = functools.partial(console().print, markup=False)
        return register_checked(Path(bundle), mlflow, model_name, promote, log)

    def __repr__(self) -> str:
        counts = ", ".join(f"{n} {s.lower()}" for s, n in state_counts(self.study).items())
        best = self.best_value
        shown = "-" if best is None else f"{best:.4g}"
        return f"SearchResult(study={self.study_name!r}: {counts or 'no trials'}; best {shown})"


def load(
    study: str,
    storage: str = DEFAULT_STORAGE,
    *,
    results: Path | str = "results",
    trainable: Callable[..., Any] | None = None,
) -> SearchResult:
    """The :class:`SearchResult` of a study that exists, read live.

    Args:
        study: The study's name.
        storage: Its storage URL (default ``sqlite:///results/optuna.db``, as ``run``'s).
        results: The folder its run wrote its files under.
        trainable: The trainable function of a study run from a notebook or a script (the
            spec names it ``__main__:function``), for :meth:`SearchResult.export`.

    Raises:
        search.errors.SearchError: One line: a storage that cannot be opened, a study that
            is not in it (naming those that are).
    """
    check_storage(storage, "storage")
    result = SearchResult(study, storage, results)
    result.study  # noqa: B018 (a study not in the storage fails here, naming those that are)
    if trainable is not None:
        receive({stored_spec(result.study, storage, required=True).trainable: trainable})
    return result
