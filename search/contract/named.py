"""The names a trainable's code could read a config key by, from its source.

A trainable that merges its defaults (``cfg = {**DEFAULTS, **config}``, ``dict(DEFAULTS,
**config)``, ``DEFAULTS | config``) reads its config in bulk, and what it reads afterwards
goes through a plain ``dict`` that :class:`~search.contract.reads.ReadConfig` cannot watch. A
space key it never reads would then pass as read. :func:`code_names` answers instead: a key
whose name the trainable's code never writes where a read could name it is unread.

A name counts as written when it is, anywhere in the code:

* a string (``cfg["lr"]``, ``cfg.get("lr")``, ``"lr" in cfg``, ``getattr(c, "lr")``, a tuple
  of names looped over), but not a key of a dict display (``DEFAULTS = {"lr": 0.1}`` defines a
  default, it reads nothing) nor a docstring;
* the start of an f-string (``cfg[f"units_{i}"]`` names every ``units_...`` key);
* an attribute (``args.lr`` after ``SimpleNamespace(**cfg)``), a function's parameter
  (``build(**cfg)`` into ``def build(lr, hidden)``), or a field of a class (a dataclass filled
  with ``Config(**cfg)``).

"The code" is the trainable's module, its package's, and every module of the user's (outside
the Python installation) they reach through what they import (a helper module that reads
``cfg["hidden"]``). A name that only a library reads (``SGD(**cfg)``) is not
found: the key is named, and reading it by name (``lr=cfg["lr"]``) clears it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import sysconfig
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

_INSTALLED = tuple(
    {
        str(Path(sysconfig.get_path(k)).resolve())
        for k in ("stdlib", "platstdlib", "purelib", "platlib")
    }
)
_OWN = str(Path(__file__).resolve().parents[1])  # this package's own modules read no user key


def code_names(func: Callable[..., Any]) -> frozenset[str]:
    """The names the code of ``func``'s project could read a config key by (module docstring);
    strings that start an f-string end with ``*``.

    Example:
        >>> from search.testing import returns_dict
        >>> "val_accuracy" in code_names(returns_dict)
        True
    """
    names: set[str] = set()
    for path in _user_files(func):
        names |= _file_names(path, path.stat().st_mtime_ns)
    return frozenset(names)


def is_named(key: str, names: frozenset[str]) -> bool:
    """Whether ``key`` is one of ``names`` or starts with one of its f-string prefixes.

    Example:
        >>> is_named("units_2", frozenset({"lr", "units_*"})), is_named("hidden", frozenset({"lr"}))
        (True, False)
    """
    if key in names:
        return True
    return any(n.endswith("*") and key.startswith(n[:-1]) for n in names)


def _user_files(func: Callable[..., Any]) -> list[Path]:
    """The source files of ``func``'s module, of its package's modules, and of every user module
    these reach through what they import (their globals: modules, functions, classes)."""
    package = (getattr(func, "__module__", None) or "").split(".")[0]
    start = sys.modules.get(getattr(func, "__module__", None) or "")
    todo = [m for name, m in list(sys.modules.items()) if name.split(".")[0] == package]
    todo += [start] if start is not None else []
    seen: set[str] = set()
    files: set[Path] = set()
    while todo:
        module = todo.pop()
        path = _user_file(module)
        if path is None or module.__name__ in seen:
            continue
        seen.add(module.__name__)
        files.add(path)
        for value in list(vars(module).values()):
            found = value if isinstance(value, ModuleType) else inspect.getmodule(value)
            if found is not None and found.__name__ not in seen:
                todo.append(found)
    own = _source(func)
    return sorted(files | ({own} if own else set()))


def _user_file(module: ModuleType) -> Path | None:
    """``module``'s source file, if it is the user's (outside the installation and ``search``)."""
    where = getattr(module, "__file__", None)
    if not isinstance(where, str) or not where.endswith(".py") or not Path(where).is_absolute():
        return None
    path = Path(where).resolve()
    if str(path).startswith((*_INSTALLED, _OWN)) or not path.is_file():
        return None
    return path


def _source(func: Callable[..., Any]) -> Path | None:
    """The file ``func`` is defined in, when it has one."""
    try:
        own = inspect.getsourcefile(inspect.unwrap(func))
    except TypeError:  # a built-in or C function: no source
        return None
    return Path(own).resolve() if own and Path(own).is_file() else None


@functools.lru_cache(maxsize=512)
def _file_names(path: Path, mtime_ns: int) -> frozenset[str]:
    """The names of one source file (``mtime_ns``: a changed file is read again)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    return frozenset(_names(tree))


def _names(tree: ast.AST) -> Iterable[str]:
    skipped = _defined_only(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in skipped:
                yield node.value
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value:
                yield first.value + "*"
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    yield item.target.id


def _defined_only(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that name nothing read: dict display keys, docstrings and
    the parts of f-strings (their start is yielded on its own)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            skipped.update(id(key) for key in node.keys if key is not None)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skipped.add(id(node.value))
        elif isinstance(node, ast.JoinedStr):
            skipped.update(id(part) for part in node.values)
    return skipped
