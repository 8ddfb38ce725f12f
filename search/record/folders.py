"""The one place a study's name becomes a folder: ``<results>/<study>``.

A study's name is read back from its storage, and whoever can write the storage chooses it:
``optuna.create_study(study_name="../../x")`` is a valid Optuna study. ``run`` refuses such a
name in its spec, but ``report``, ``export``, the dashboard's artifacts and the confirmation
storage take the name from the storage. Every one of them builds the study's folder with
:func:`study_folder`, which refuses a name that would leave ``--results`` (or be it) in one
line, before anything is written.
"""

from __future__ import annotations

from pathlib import Path

from search.errors import SearchError, one_line


class UnsafeNameError(SearchError):
    """A name read from a storage would put files outside the results folder."""


def safe_name(name: str) -> bool:
    """Whether ``name`` is one folder name inside a folder: not empty, not ``.`` nor ``..``,
    and without ``/``, ``\\`` or NUL.

    Example:
        >>> safe_name("cnn-mnist"), safe_name("../../escape"), safe_name(".."), safe_name("a/b")
        (True, False, False, False)
    """
    return name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


def study_folder(results_dir: Path | str, study_name: str) -> Path:
    """``results_dir/<study_name>``, the folder of everything the project writes for a study.

    Raises:
        UnsafeNameError: When the name would leave ``results_dir`` (:func:`safe_name`).

    Example:
        >>> study_folder(Path("results"), "cnn")
        PosixPath('results/cnn')
    """
    if not safe_name(study_name):
        raise UnsafeNameError(
            f"study name {one_line(repr(study_name))} (as the storage holds it) would put "
            f"files outside --results {one_line(str(results_dir))}; copy the study under a "
            "plain name (optuna.copy_study) to report or export it"
        )
    return Path(results_dir) / study_name
