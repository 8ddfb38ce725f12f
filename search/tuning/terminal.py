"""The rich consoles that print to the user: wrapped to the terminal on a terminal, and never
wrapped when piped or redirected.

Rich wraps every line and table cell to the console's width, 80 columns when the stream is
not a terminal: a log path in a FAIL line broke in the middle (it could not be copied), a
number in a table broke in two (``4.557e-0`` / ``5``). Piped, the console is as wide as
:data:`PIPE_WIDTH` with soft wrap (long lines go out whole; a terminal or a pager that shows
them wraps them itself), and tables take the width their cells need. In a notebook's kernel
the console writes plain text: Rich would send escape codes to the cell's streams.
"""

from __future__ import annotations

from rich.console import Console

from search.tuning.notebook import in_notebook

PIPE_WIDTH = 10_000
"""The width of a console whose stream is not a terminal: wider than any line or table row."""


def console(stderr: bool = False) -> Console:
    """A console on stdout (or ``stderr``), wrapped only on a terminal (module docstring); in
    a notebook's kernel, plain text (a cell's output shows no terminal escape codes)."""
    if in_notebook():
        return Console(
            stderr=stderr, highlight=False, width=PIPE_WIDTH, soft_wrap=True,
            color_system=None, force_jupyter=False,
        )  # fmt: skip
    found = Console(stderr=stderr, highlight=False)
    if found.is_terminal:
        return found
    return Console(stderr=stderr, highlight=False, width=PIPE_WIDTH, soft_wrap=True)
