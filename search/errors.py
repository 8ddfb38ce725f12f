"""Errors the CLI turns into one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations


def one_line(text: str) -> str:
    r"""``text`` with line breaks and other unprintable characters escaped: one console line.

    Example:
        >>> print(one_line("bad\nkey\r"))
        bad\nkey\r
    """
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


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
    """``exc`` and the errors behind it (``__cause__``, else ``__context__``), outermost first.

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
        current = current.__cause__ or current.__context__
    return chain


def database_locked(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error behind it) is SQLite's ``database is locked``: another
    process holds a write transaction on the file for longer than the busy timeout."""
    return any("database is locked" in str(e) for e in causes(exc))
