"""Checks a spec's knobs against what its trainable reads, before any trial starts.

A misspelled knob (``lrr``) would otherwise fail every trial of the study, one by one. A
trainable declared with ``@trainable(defaults=...)`` (every built-in is) declares its knobs;
user trainables without them are not checked. A built-in's knobs are read from a
framework-free table (:data:`search.contract.registry.BUILTIN_KNOBS`); a user's trainable is
imported, which costs its framework's import once in the driver (before Ray starts in the
CLI's preflight, :func:`check_user_trainable`, which also refuses a function that returns
instead of yielding), never at ``--help``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.contract import BUILTIN_KNOBS, UnknownTrainableError, declarations, declared_defaults
from search.errors import SearchError

if TYPE_CHECKING:
    from search.specs.schema import StudySpec


class KnobError(SearchError):
    """The spec names a knob its trainable does not read, or a file that is not there."""


def declared_knobs(trainable: str, source: str = "spec") -> Mapping[str, Any] | None:
    """The trainable's declared defaults (knob -> default), or ``None`` when it has none.

    Raises:
        KnobError: When the trainable's module or function cannot be found (one line).
    """
    try:
        return declared_defaults(trainable)
    except UnknownTrainableError as exc:
        raise KnobError(f"{source}: trainable: {exc}") from None


def check_knobs(spec: StudySpec, source: str = "spec") -> None:
    """Every knob in ``space`` and ``fixed`` is one the trainable reads; ``*_path`` files exist.

    Raises:
        KnobError: One line naming the file, the field and the known knobs.
    """
    known = declared_knobs(spec.trainable, source)
    fields = [("space", name) for name in spec.space] + [("fixed", name) for name in spec.fixed]
    if known is not None:
        for block, name in fields:
            if name not in known:
                raise KnobError(
                    f"{source}: {block}.{name}: {spec.trainable} has no knob {name!r} "
                    f"(known: {', '.join(sorted(known))})"
                )
    for name, value in spec.fixed.items():
        is_path = name.endswith("_path") and isinstance(value, str) and value
        if is_path and not Path(value).exists():
            raise KnobError(f"{source}: fixed.{name}: no file at {value}")


def check_user_trainable(spec: StudySpec, source: str = "spec") -> None:
    """:func:`check_knobs` for a user's trainable, which imports its module, and the shape of
    its function: a generator (``yield`` one dict per epoch), not a function that returns.

    Raises:
        KnobError: One line naming the file and the trainable.

    Example:
        >>> from search.specs.schema import parse_spec
        >>> spec = parse_spec({"study": "s", "trainable": "search.testing:returns_dict",
        ...                    "objective": {"metric": "val_accuracy", "mode": "max"}})
        >>> check_user_trainable(spec, "s.yaml")
        Traceback (most recent call last):
        ...
        search.specs.knobs.KnobError: s.yaml: trainable `search.testing:returns_dict` must yield ...
    """
    check_knobs(spec, source)
    if declarations(spec.trainable).returns:
        raise KnobError(
            f"{source}: trainable `{spec.trainable}` must yield one dict of metrics per epoch "
            "(a generator); it returns instead"
        )


def check_builtin_knobs(spec: StudySpec, source: str = "spec") -> bool:
    """:func:`check_knobs` for a built-in trainable, which imports nothing (a misspelled knob
    can then stop ``run`` before Ray or Ray Tune); ``False``, unchecked, for a user's trainable,
    whose check imports its module.

    Example:
        >>> from search.specs.schema import parse_spec
        >>> spec = parse_spec({"study": "s", "trainable": "search.testing:curve",
        ...                    "objective": {"metric": "val_accuracy", "mode": "max"}})
        >>> check_builtin_knobs(spec)
        False
    """
    if spec.trainable not in BUILTIN_KNOBS:
        return False
    check_knobs(spec, source)
    return True
