"""Errors the CLI turns into one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import difflib
import errno
from collections.abc import Iterable
from typing import Literal


def one_line(
    what: BaseException | str,
    limit: int | None = None,
    where: Literal["all", "first", "last"] = "all",
) -> str:
    r"""``what`` (a text, or an exception's ``str()``) as one console line.

    The one way an error becomes a line of a message, a log or a trial's ``fail_reason``.

    Args:
        what: The text, or the exception whose text it is.
        limit: The most characters kept (the line is cut there); ``None`` keeps all.
        where: Which of its lines: ``"all"`` (every line, the breaks escaped), ``"first"``
            (a message's headline), or ``"last"`` (the last that is not blank, stripped: where
            a traceback or a wrapped error says what went wrong).

    Returns:
        The line, line breaks and other unprintable characters escaped, at most ``limit`` long.

    Example:
        >>> print(one_line("bad\nkey\r"))
        bad\nkey\r
        >>> one_line(ValueError("no such table: trials\n[SQL: SELECT 1]"), where="first")
        'no such table: trials'
        >>> one_line("Traceback (most recent call last):\n  ...\nKeyError: 'lr'\n\n", where="last")
        "KeyError: 'lr'"
        >>> one_line("x" * 500, limit=5), one_line("", where="first"), one_line(" ", where="last")
        ('xxxxx', '', '')
    """
    text = str(what)
    if where == "first":
        text = next(iter(text.splitlines()), "")
    elif where == "last":
        text = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return text if limit is None else text[:limit]


def closest(given: str, known: Iterable[str]) -> str | None:
    """The one of ``known`` closest to ``given`` (a misspelling of it), or ``None``.

    Example:
        >>> closest("alpah", ["alpha", "beta"]), closest("zz", ["alpha"])
        ('alpha', None)
    """
    match = difflib.get_close_matches(given, list(known), n=1)
    return match[0] if match else None


def did_you_mean(given: str, known: Iterable[str]) -> str:
    """`` (did you mean 'alpha'?)`` when one of ``known`` is close to ``given``, else ``''``.

    Example:
        >>> did_you_mean("trian", ["train", "export"])
        " (did you mean 'train'?)"
    """
    match = closest(given, known)
    return f" (did you mean {match!r}?)" if match else ""


class SearchError(Exception):
    """Base class of the errors that users can fix; ``str()`` is the whole message."""


class SpecError(SearchError):
    """A spec file is malformed.

    Args:
        source: The file (or ``<cli>``) the bad value came from.
        field: Dotted path of the field, empty for the file as a whole.
        message: What was expected (and what was given).

    Example:
        >>> str(SpecError("spaces/cnn.yaml", "budget.trials", "must be at least 1, got 0"))
        'spaces/cnn.yaml: budget.trials: must be at least 1, got 0'
    """

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source, self.field, self.message = source, field, message
        # A file name or a key may hold a line break; the message is one line all the same.
        parts = [one_line(source), one_line(field), " ".join(message.split())]
        super().__init__(": ".join(p for p in parts if p))


def causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors behind it (``__cause__``, else an unsuppressed ``__context__``),
    outermost first.

    Example:
        >>> try:
        ...     try:
        ...         raise KeyError("inner")
        ...     except KeyError as e:
        ...         raise RuntimeError("outer") from e
        ... except RuntimeError as e:
        ...     [type(x).__name__ for x in causes(e)]
        ['RuntimeError', 'KeyError']
    """
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        suppressed = current.__suppress_context__  # ``raise ... from None``
        current = current.__cause__ or (None if suppressed else current.__context__)
    return chain


def database_locked(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error behind it) is SQLite's ``database is locked``: another
    process holds a write transaction on the file for longer than the busy timeout."""
    return any("database is locked" in str(e) for e in causes(exc))


FULL_DISK_TEXTS = ("database or disk is full", "No space left on device", "[Errno 28]")
"""What a full disk's error says when it comes as text: SQLite's, the C library's for
``ENOSPC``, and Python's ``OSError`` for errno 28 (the error a trial's process raised
reaches the driver inside Ray's wrapper, its type lost)."""


def disk_full(exc: BaseException) -> str | None:
    """Whether ``exc`` (or an error behind it) is a full disk: ``None`` when not; else the
    file the error names, ``""`` when it names none (SQLite's ``database or disk is full``,
    a ``write`` that met ``ENOSPC``, a trial's error that says so).

    Example:
        >>> disk_full(OSError(errno.ENOSPC, "No space left on device", "/data/x.db"))
        '/data/x.db'
        >>> disk_full(RuntimeError("OSError: [Errno 28] Error writing bytes to file"))
        ''
        >>> disk_full(ValueError("bad")) is None
        True
    """
    for error in causes(exc):
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return str(error.filename or "")
        if any(text in str(error) for text in FULL_DISK_TEXTS):
            return ""
    return None


class DiskFullError(SearchError):
    """A disk the run writes to is full: nothing is the config's fault; free space, rerun.

    Example:
        >>> str(DiskFullError("/data"))
        'no space left on device for /data: free space and run the same command again'
    """

    def __init__(self, where: str) -> None:
        super().__init__(
            f"no space left on device for {one_line(where)}: free space and run the same "
            "command again"
        )


def error_summary(error: BaseException | None) -> str:
    """One line that says what a trial's exception was (no traceback).

    Ray wraps the trainable's exception; the original is its ``cause`` when there is one.
    """
    if error is None:
        return "the trial raised an error"
    cause = getattr(error, "cause", None)
    while cause is not None and getattr(cause, "cause", None) is not None:
        cause = cause.cause
    exc = cause if isinstance(cause, BaseException) else error
    text = one_line(exc, where="last")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
