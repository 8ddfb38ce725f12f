"""A trial's config that notes which keys the trainable reads.

A plain function (no :func:`~search.contract.declare.trainable` decorator) declares no knobs,
so a space key it never reads (``alpah`` for ``alpha``) cannot be refused up front: the study
would sample it in every trial and print it among the best parameters. The worker hands such
a trainable a :class:`ReadConfig` instead of a plain ``dict``, and reports what it never read
(:mod:`search.run.worker`); the driver stops the run on it (:mod:`search.run.stopping`).

A key counts as read when the trainable asks for it by name (``config["lr"]``,
``config.get("lr")``, ``"lr" in config``, ``setdefault``, ``pop``). Reading the config in bulk
(iterating it, ``items()``, ``keys()``, ``values()``, ``dict(config)``, ``{**config}``,
``f(**config)``, ``copy()``, ``json.dumps``) counts as reading every key: what it was copied
into cannot be followed, and a key is never called unread when the trainable may have read it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

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
        >>> merged = {**config}  # a bulk read: every key may have been read
        >>> config.unread()
        []
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._asked: set[Any] = set()
        self._bulk = False

    def unread(self) -> list[str]:
        """The keys held and never asked for, sorted (none after a bulk read)."""
        if self._bulk:
            return []
        return sorted(str(k) for k in dict.keys(self) if k not in self._asked)

    def missed(self) -> list[str]:
        """The keys asked for that the config does not hold, sorted."""
        return sorted(str(k) for k in self._asked if not dict.__contains__(self, k))

    def _all(self) -> None:
        self._bulk = True

    def __getitem__(self, key: Any) -> Any:
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
        self._all()
        return super().__iter__()

    def keys(self) -> dict_keys[str, Any]:
        self._all()
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
