"""The trainable's one declaration (``@trainable``) and the model it returns (``train_to_end``)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from search.contract import TrialContext, declarations, train_to_end, trainable
from search.contract.registry import IN_PROCESS

USER_MODULE = textwrap.dedent(
    """
    from search.contract import trainable

    @trainable(defaults={"lr": 0.1, "hidden": 8}, data_parallel="in_process")
    def fit(config, data, ctx):
        for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
            yield {"loss": config.get("lr", 0.1) / epoch}
        return {"weights": [1, 2, 3]}

    @fit.exporter
    def save(config, data, ctx, out_dir):
        return {"saved": 1.0}

    def plain(config, data, ctx):
        yield {"loss": 1.0}

    def plain_export(config, data, ctx, out_dir):  # a name alone declares nothing
        return {}

    DEFAULTS = {"lr": 1.0}  # nor does a module constant
    """
)


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "userpkg_declare").mkdir()
    (tmp_path / "userpkg_declare" / "__init__.py").write_text("")
    (tmp_path / "userpkg_declare" / "model.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "userpkg_declare.model"
    for name in [m for m in sys.modules if m.startswith("userpkg_declare")]:
        del sys.modules[name]
    declarations.cache_clear()


def test_the_decorator_is_the_one_declaration_the_registry_reads(user_package: str) -> None:
    found = declarations(f"{user_package}:fit")
    assert found.defaults == {"lr": 0.1, "hidden": 8}
    assert found.data_parallel == IN_PROCESS
    assert found.export is not None and found.export({}, None, None, Path(".")) == {"saved": 1.0}
    plain = declarations(f"{user_package}:plain")
    assert (plain.defaults, plain.data_parallel, plain.export) == (None, None, None)


def test_data_parallel_true_means_processes_and_a_bad_mode_is_refused() -> None:
    @trainable(data_parallel=True)
    def train(config: Any, data: Any, ctx: Any) -> Iterator[dict[str, float]]:
        yield {}

    assert train.__search_trainable__.data_parallel is True
    with pytest.raises(ValueError, match="data_parallel='threads'"):
        trainable(data_parallel="threads")  # type: ignore[arg-type]


def test_train_to_end_gets_what_the_generator_returns(user_package: str) -> None:
    history: list[dict[str, float]] = []
    fit = declarations(f"{user_package}:fit").train
    trained = train_to_end(fit, {"lr": 0.4}, None, TrialContext(max_epochs=2, history=history))
    assert trained.model == {"weights": [1, 2, 3]}
    assert trained.epochs == 2 and trained.metrics == {"loss": 0.2} and len(history) == 2


def test_train_to_end_keeps_an_early_return_and_says_what_is_missing() -> None:
    def stops_early(config: Any, data: Any, ctx: TrialContext) -> Any:
        yield {"loss": 1.0}
        return "model after epoch 1"

    def forgets(config: Any, data: Any, ctx: TrialContext) -> Any:
        for _ in range(ctx.max_epochs):
            yield {"loss": 1.0}

    def explodes(config: Any, data: Any, ctx: TrialContext) -> Any:
        yield {"loss": float("nan")}
        return "never"

    ctx = TrialContext(max_epochs=3)
    early = train_to_end(stops_early, {}, None, ctx)
    assert (early.model, early.epochs) == ("model after epoch 1", 1)
    with pytest.raises(RuntimeError, match="returned no model: end it with `return model`"):
        train_to_end(forgets, {}, None, ctx)
    with pytest.raises(RuntimeError, match="training failed: loss is nan at epoch 1"):
        train_to_end(explodes, {}, None, ctx)


def test_a_trainable_without_an_export_hook_is_pointed_at_train_exporter() -> None:
    """The refusal names the public way to declare a hook, not an internal module."""
    from search.handover.train import no_hook

    line = no_hook("mod:fn")
    assert "@fn.exporter" in line and "def export(config, data, ctx, out_dir)" in line
    assert "search/" not in line and "\n" not in line
