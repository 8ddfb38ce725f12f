"""search.lightning: a user's ``trainer.fit`` run once in a thread, one yield per epoch.

The example's breast-cancer MLP (examples/lightning_mlp), driven directly (no Ray).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("lightning")

import search.lightning  # noqa: E402
from examples.lightning_mlp import mlp  # noqa: E402
from search.contract import TrialContext  # noqa: E402

pytestmark = pytest.mark.torch  # Lightning runs on PyTorch: make test-fast leaves it out


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    return mlp.load()


def _fit(data: dict[str, np.ndarray], ctx: TrialContext, **knobs: Any) -> Any:
    return mlp.train({"hidden": 8, **knobs}, data, ctx)


def _ran(module: Any) -> int:
    return int(module.trainer.current_epoch)


def test_every_epoch_yields_the_logged_metrics_as_floats(data: dict[str, np.ndarray]) -> None:
    steps = _fit(data, TrialContext(max_epochs=3))
    epochs = []
    with pytest.raises(StopIteration) as done:
        while True:
            epochs.append(next(steps))
    assert len(epochs) == 3
    for metrics in epochs:
        assert {"val_loss", "val_accuracy", "train_loss"} <= metrics.keys()
        assert all(type(v) is float for v in metrics.values())
    assert isinstance(done.value.value, mlp.MLP) and _ran(done.value.value) == 3


def test_closing_the_generator_stops_training_early(data: dict[str, np.ndarray]) -> None:
    module: list[Any] = []
    original = mlp.MLP.on_train_epoch_start

    def spy(self: Any) -> None:
        module.append(self)
        original(self)

    steps = _fit(data, TrialContext(max_epochs=10))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mlp.MLP, "on_train_epoch_start", spy)
        next(steps)
        next(steps)
        steps.close()  # ASHA's prune
    assert len(module) == 2  # no third epoch started
    assert module[0].trainer.should_stop


def test_a_retried_trial_resumes_at_the_saved_epoch(
    data: dict[str, np.ndarray], tmp_path: Path
) -> None:
    first = _fit(data, TrialContext(max_epochs=4, checkpoint_dir=str(tmp_path)))
    next(first)
    next(first)
    first.close()
    assert (tmp_path / search.lightning.CHECKPOINT_FILE).is_file()
    ctx = TrialContext(max_epochs=4, restore_dir=str(tmp_path), start_epoch=3)
    again = _fit(data, ctx)
    epochs = []
    with pytest.raises(StopIteration) as done:
        while True:
            epochs.append(next(again))
    assert len(epochs) == 2  # epochs 3 and 4 only
    assert _ran(done.value.value) == 4


def test_lightnings_own_chatter_stays_off_the_console_and_the_users_warnings_do_not(
    data: dict[str, np.ndarray],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    recwarn: pytest.WarningsRecorder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import logging
    import warnings

    monkeypatch.setattr(logging.getLogger(search.lightning._RANK_ZERO_LOG), "level", 0)
    original = mlp.MLP.on_train_epoch_end

    def users_own(self: Any) -> None:
        warnings.warn("the user's own warning", UserWarning, stacklevel=2)
        original(self)

    monkeypatch.setattr(mlp.MLP, "on_train_epoch_end", users_own)
    steps = _fit(data, TrialContext(max_epochs=2, checkpoint_dir=str(tmp_path)))
    assert len(list(steps)) == 2
    console = "".join(capfd.readouterr()) + caplog.text  # Lightning's handler, or pytest's
    for chatter in ("GPU available", "TPU available", "litlogger", "weights_only", "stopped"):
        assert chatter not in console, console
    said = [str(w.message) for w in recwarn]
    assert not [m for m in said if "LeafSpec" in m], said
    assert "the user's own warning" in said


def test_precision_knobs_map_to_lightnings_names() -> None:
    ctx = TrialContext(max_epochs=2)
    assert search.lightning.trainer_options(ctx, {"precision": "bf16"})["precision"] == (
        "bf16-mixed"
    )
    options = search.lightning.trainer_options(ctx, {})
    assert options["precision"] == "32-true" and options["accelerator"] == "cpu"
    assert options["max_epochs"] == 2 and options["logger"] is False
    cuda = TrialContext(max_epochs=2, device="cuda")
    assert search.lightning.trainer_options(cuda, {"precision": "fp16"})["accelerator"] == "gpu"


def test_without_lightning_fit_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "lightning" else real(name)
    )
    with pytest.raises(ImportError, match=r"^search.lightning needs Lightning: pip install"):
        search.lightning.fit(object(), TrialContext(max_epochs=1))


def test_max_epochs_comes_from_the_context() -> None:
    with pytest.raises(TypeError, match="max_epochs"):
        search.lightning.fit(object(), TrialContext(max_epochs=1), trainer_kwargs={"max_epochs": 3})


def test_a_trial_of_several_processes_takes_strategy_and_devices_itself() -> None:
    ddp = TrialContext(max_epochs=1, world_size=2, rank=1)
    assert search.lightning.trainer_options(ddp, {})["devices"] == 2
    with pytest.raises(TypeError, match="sets devices and strategy in a trial of 2 processes"):
        search.lightning.fit(object(), ddp, trainer_kwargs={"strategy": "ddp", "devices": 2})
    alone = search.lightning.fit(object(), ddp)  # world_size set by hand: no process group
    with pytest.raises(RuntimeError, match="ctx.world_size is 2 but this process is in no"):
        next(alone)
