"""Trial actors that start as fast as the Ray allows: no ``runtime_env`` that repeats
the environment their workers already inherit.

Ray Tune registers every trainable class with ``ray.remote(runtime_env={"env_vars": ...})``
(``ray/tune/execution/class_cache.py``: ``PL_DISABLE_FORK`` and the variables it propagates
from the driver). A worker with a ``runtime_env`` starts through Ray's ``setup_worker.py``, a
second Python start (about 0.4 CPU-s a worker here). Every worker inherits its raylet's
environment (:func:`search.compute.worker_env.worker_env`: the local Ray a run started, or a
joined Ray whose nodes all run on this machine): when Tune's variables are all there with the same
values, :func:`inherited_env` registers the class without one. On another cluster, or when a
variable changed after the Ray started, Tune's own registration stands. Ray offers no
switch for it, so the method is replaced while the block runs, and restored.

Example:
    >>> with inherited_env():
    ...     pass
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from search.compute.worker_env import worker_env


def tune_env() -> dict[str, str]:
    """The variables Tune gives each trial actor, as ``_ActorClassCache.get`` computes them."""
    from ray.tune.execution import class_cache

    env = dict(class_cache.DEFAULT_ENV_VARS)
    env.update({k: os.environ[k] for k in class_cache.ENV_VARS_TO_PROPAGATE if k in os.environ})
    return env


def redundant(env: dict[str, str], inherited: dict[str, str]) -> bool:
    """Whether every variable of ``env`` is in ``inherited`` with the same value.

    Example:
        >>> redundant({"A": "1"}, {"A": "1", "B": "2"}), redundant({"A": "1"}, {"A": "0"})
        (True, False)
    """
    return all(inherited.get(k) == v for k, v in env.items())


@contextlib.contextmanager
def inherited_env() -> Iterator[None]:
    """Tune's trial actors registered without a ``runtime_env`` while the block runs, where
    the Ray's workers inherit the same variables (the module's docstring)."""
    try:
        from ray.tune.execution.class_cache import _ActorClassCache
    except ImportError:  # Tune moved it: its own registration stands
        yield
        return
    tune_get = _ActorClassCache.get

    def get(self: Any, trainable_cls: Any) -> Any:
        if trainable_cls in self._cache:
            return tune_get(self, trainable_cls)
        inherited = worker_env()
        if not inherited or not redundant(tune_env(), inherited):
            return tune_get(self, trainable_cls)
        import ray

        self._cache[trainable_cls] = ray.remote(trainable_cls)
        return self._cache[trainable_cls]

    _ActorClassCache.get = get  # type: ignore[method-assign]
    try:
        yield
    finally:
        _ActorClassCache.get = tune_get  # type: ignore[method-assign]
