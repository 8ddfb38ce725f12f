"""A space key a plain trainable never reads is found when it merges its defaults (issue 35).

Each trainable is a user's module written into ``tmp_path`` and imported as a user's is; its
first epoch runs on the :class:`ReadConfig` the worker hands it, and the keys the worker would
report unread are those of :func:`code_names` after the bulk read of the merge.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from search.contract.named import code_names
from search.contract.reads import ReadConfig

USER_MODULE = '''
"""Knobs: lr, hidden, dropout (this docstring names them; it reads none)."""
from dataclasses import dataclass
from types import SimpleNamespace

DEFAULTS = {"lr": 0.01, "hidden": 16, "dropout": 0.1, "epochs": 3}


def spread(config, data, ctx):
    cfg = {**DEFAULTS, **config}
    yield {"score": cfg["lr"] * cfg["hidden"]}  # epochs: a default, never read


def called(config, data, ctx):
    cfg = dict(DEFAULTS, **config)
    yield {"score": cfg.get("lr") * cfg["hidden"]}


def union(config, data, ctx):
    cfg = DEFAULTS | config
    yield {"score": cfg["lr"] * cfg["hidden"] * (1 - cfg["dropout"])}


def _build(lr, hidden, dropout, **rest):
    return lr * hidden * (1 - dropout)


def into_a_function(config, data, ctx):
    yield {"score": _build(**{**DEFAULTS, **config})}


@dataclass
class Settings:
    lr: float = 0.01
    hidden: int = 16


def into_fields(config, data, ctx):
    s = Settings(**config)
    yield {"score": s.lr * s.hidden}


def as_attributes(config, data, ctx):
    args = SimpleNamespace(**{**DEFAULTS, **config})
    yield {"score": args.lr * args.dropout}


def per_layer(config, data, ctx):
    cfg = {**DEFAULTS, **config}
    yield {"score": sum(cfg[f"units_{i}"] for i in range(2)) * cfg["lr"]}
'''


@pytest.fixture
def user_module(tmp_path: Path) -> Iterator[Any]:
    path = tmp_path / "merging_user.py"
    path.write_text(USER_MODULE)
    spec = importlib.util.spec_from_file_location("merging_user", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["merging_user"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["merging_user"]


def _unread(train: Any, config: dict[str, Any]) -> list[str]:
    """What the worker reports unread after the trainable's first epoch."""
    reads = ReadConfig(config)
    next(train(reads, None, None))
    return reads.unread(code_names(train) if reads.bulk else None)


@pytest.mark.parametrize(
    ("name", "config", "dead"),
    [
        ("spread", {"lr": 0.1, "hidden": 8, "epochs": 5}, ["epochs"]),
        ("called", {"lr": 0.1, "hidden": 8, "momentum": 0.9}, ["momentum"]),
        ("union", {"lr": 0.1, "hidden": 8, "dropout": 0.2, "layers": 3}, ["layers"]),
        ("into_a_function", {"lr": 0.1, "hidden": 8, "weight_decay": 0.1}, ["weight_decay"]),
        ("into_fields", {"lr": 0.1, "hidden": 8}, []),
        ("as_attributes", {"lr": 0.1, "dropout": 0.2, "hiden": 4}, ["hiden"]),
        ("per_layer", {"lr": 0.1, "units_0": 4, "units_1": 8, "unit_2": 2}, ["unit_2"]),
    ],
)
def test_a_key_the_code_never_names_is_unread_after_a_merge(
    user_module: Any, name: str, config: dict[str, Any], dead: list[str]
) -> None:
    assert _unread(getattr(user_module, name), config) == dead


def test_a_merge_that_reads_every_key_by_name_leaves_none_unread(user_module: Any) -> None:
    assert _unread(user_module.union, {"lr": 0.1, "hidden": 8, "dropout": 0.2}) == []
    assert _unread(user_module.into_a_function, {"lr": 0.1, "hidden": 8, "dropout": 0.2}) == []


def test_a_dict_key_or_a_docstring_is_no_read(user_module: Any) -> None:
    names = code_names(user_module.spread)
    assert {"lr", "hidden", "units_*", "config"} <= names  # strings, f-string starts, parameters
    assert "dropout" in names  # read by as_attributes (an attribute) and _build (a parameter)
    assert not {"epochs", "momentum", "layers"} & names  # a dict's key, a docstring, nowhere
