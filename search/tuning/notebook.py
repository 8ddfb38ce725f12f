"""The live status block in a Jupyter notebook: one HTML block that updates in place.

Rich's ``Live`` redraws with terminal escape codes (or, in Jupyter, needs ``ipywidgets``);
a notebook's cell shows neither well. IPython's own ``display(..., display_id=True)`` gives a
handle whose ``update`` replaces the block's contents: the status goes out as plain text in
``<pre>`` (and ``text/plain``), refreshed from Tune's loop at most :data:`REFRESH_S` apart.
Rich's consoles, in a notebook, print the trial lines as HTML themselves (no escape codes).

Example:
    >>> in_notebook()
    False
"""

from __future__ import annotations

import html
import sys
import time
from collections.abc import Callable
from typing import Any

REFRESH_S = 0.5
"""Least seconds between two updates of the block."""


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel running a cell (IPython's ZMQ shell)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


class NotebookLive:
    """A status block in the cell's output, with rich ``Live``'s ``start``, ``refresh`` and
    ``stop``.

    Args:
        render: The block's text, asked at each refresh.
    """

    def __init__(self, render: Callable[[], str]) -> None:
        self._render = render
        self._handle: Any = None
        self._shown = 0.0

    def _bundle(self) -> dict[str, str]:
        text = self._render()
        return {"text/plain": text, "text/html": f"<pre>{html.escape(text)}</pre>"}

    def start(self) -> None:
        from IPython.display import display

        self._handle = display(self._bundle(), raw=True, display_id=True)
        self._shown = time.monotonic()

    def refresh(self, force: bool = False) -> None:
        """Updates the block, unless it was updated less than :data:`REFRESH_S` ago."""
        if self._handle is None or (not force and time.monotonic() - self._shown < REFRESH_S):
            return
        self._handle.update(self._bundle(), raw=True)
        self._shown = time.monotonic()

    def stop(self) -> None:
        """The last update: the block keeps the run's final status."""
        self.refresh(force=True)
        self._handle = None
