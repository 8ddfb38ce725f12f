"""A trial's config that notes which keys the trainable reads.

A plain function (no :func:`~search.contract.declare.trainable` decorator) declares no knobs,
so a space key it never reads (``alpah`` for ``alpha``) cannot be refused up front: the study
would sample it in every trial and print it among the best parameters. The worker hands such
a trainable a :class:`ReadConfig` instead of a plain ``dict``, and reports what it never read
(:mod:`search.tuning.worker`); the driver stops the run on it (:mod:`search.tuning.stopping`).

A key counts as read when the trainable asks for it by name (``config["lr"]``,
``config.get("lr")``, ``"lr" in config``, ``setdefault``, ``pop``). Reading the config in bulk
(iterating it, ``items()``, ``keys()``, ``values()``, ``dict(config)``, ``{**config}``,
``f(**config)``, ``copy()``, ``json.dumps``; the merges of defaults ``{**DEFAULTS, **config}``,
``dict(DEFAULTS, **config)`` and ``DEFAULTS | config``) cannot be followed into what it was
copied into: after one, a key not asked for by name counts as read when the trainable's code
names it anywhere a read could (``names``, from :func:`search.contract.named.code_names`), so
a dead knob of a trainable that merges its defaults is still found.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from search.contract.named import is_named

if TYPE_CHECKING:
    from _collections_abc import dict_items, dict_keys, dict_values


class ReadConfig(dict[str, Any]):
    """A ``dict`` that records the keys asked for (see the module docstring).

    Example:
        >>> config = ReadConfig({"alpha": 0.1, "alpah": 0.2})
        >>> config["alpha"], config.get("beta", 1.0)
        (0.1, 1.0)
        >>> config.unread(), config.missed()
        (['alpah'], ['beta'])
        >>> merged = {**config}  # a bulk read: every key may have been read...
        >>> config.unread(), config.unread(names=frozenset({"beta"}))  # ...or the code names it
        ([], ['alpah'])
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._asked: set[Any] = set()
        self._bulk = False
        self._copying: set[Any] = set()  # keys a bulk copy is about to get, not asked by name

    @property
    def bulk(self) -> bool:
        """Whether the config was read in bulk (iterated, copied, merged into another dict)."""
        return self._bulk

    def unread(self, names: frozenset[str] | None = None) -> list[str]:
        """The keys held and never asked for, sorted. After a bulk read, those of them that
        ``names`` (the names the trainable's code reads by) does not hold; none without it."""
        if self._bulk and names is None:
            return []
        never = (k for k in dict.keys(self) if k not in self._asked)
        if self._bulk:
            never = (k for k in never if not is_named(str(k), names or frozenset()))
        return sorted(str(k) for k in never)

    def missed(self) -> list[str]:
        """The keys asked for that the config does not hold, sorted."""
        return sorted(str(k) for k in self._asked if not dict.__contains__(self, k))

    def _all(self) -> None:
        self._bulk = True

    def _copy(self) -> None:
        """A bulk read that gets each key next (``{**config}``, ``dict(D, **config)``, a loop
        over the keys): those gets are the copy's, not reads by name."""
        self._all()
        self._copying = set(dict.keys(self))

    def __getitem__(self, key: Any) -> Any:
        if key in self._copying:
            self._copying.discard(key)
        else:
            self._asked.add(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._asked.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._asked.add(key)
        return super().__contains__(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._asked.add(key)
        return super().setdefault(key, default)

    def pop(self, key: Any, *default: Any) -> Any:
        self._asked.add(key)
        return super().pop(key, *default)

    # Bulk reads. Overriding ``__iter__`` also makes ``dict(config)``, ``{**config}`` and
    # ``f(**config)`` go through ``keys()`` (CPython copies a dict subclass that keeps
    # dict's own ``__iter__`` without calling any of its methods).
    def __iter__(self) -> Iterator[Any]:
        self._copy()
        return super().__iter__()

    def keys(self) -> dict_keys[str, Any]:
        self._copy()
        return super().keys()

    def items(self) -> dict_items[str, Any]:
        self._all()
        return super().items()

    def values(self) -> dict_values[str, Any]:
        self._all()
        return super().values()

    def copy(self) -> dict[str, Any]:
        self._all()
        return dict(super().items())

    def __reduce__(self) -> tuple[Any, ...]:  # pickled or copied: a plain dict, all read
        self._all()
        return (dict, (dict(super().items()),))
