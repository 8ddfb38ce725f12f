"""search.keras: a user's ``model.fit`` run once in a thread, one yield per epoch.

A tiny Dense model on scikit-learn's wine data (178 samples, 13 features), 2 threads.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

with contextlib.suppress(ImportError):  # torch before TensorFlow (the other order segfaults)
    import torch  # noqa: F401

pytest.importorskip("tensorflow")

import keras  # noqa: E402

import search.keras  # noqa: E402
from search.compute.limits import apply_limits  # noqa: E402
from search.contract import Dataset, TrialContext, train_to_end  # noqa: E402

pytestmark = pytest.mark.tf

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
FIT: dict[str, Any] = {"batch_size": 32, "shuffle": False}


@pytest.fixture(scope="module")
def wine() -> Arrays:
    from sklearn.datasets import load_wine

    apply_limits(TrialContext(max_epochs=1, num_threads=2))  # before any TF op
    x, y = load_wine(return_X_y=True)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order].astype(np.int64)
    return x[:128], y[:128], x[128:], y[128:]


def build(lr: float = 1e-2, with_input: bool = True) -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)]
    model = keras.Sequential(([keras.Input((13,))] if with_input else []) + layers)
    model.compile(
        optimizer=keras.optimizers.Adam(lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class Recorder(keras.callbacks.Callback):
    """Counts fit calls and epochs; keeps what each epoch began with (weights, steps)."""

    def __init__(self, fail_at: int | None = None, watch: Any = None) -> None:
        super().__init__()
        self.fail_at, self.watch = fail_at, watch
        self.watched: list[float] = []  # ``watch.best`` (an EarlyStopping) as epochs begin
        self.train_begins = self.train_ends = 0
        self.epochs: list[int] = []
        self.begin_weights: list[list[np.ndarray]] = []
        self.begin_steps: list[int] = []

    def on_train_begin(self, logs: Any = None) -> None:
        self.train_begins += 1

    def on_train_end(self, logs: Any = None) -> None:
        self.train_ends += 1

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epochs.append(epoch)
        self.begin_weights.append(self.model.get_weights())
        self.begin_steps.append(int(self.model.optimizer.iterations))
        if self.watch is not None:
            self.watched.append(float(self.watch.best))

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if epoch + 1 == self.fail_at:
            raise FloatingPointError(f"boom at epoch {epoch + 1}")


def fit_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("keras-fit-")]


def test_every_epoch_yields_float_logs(wine: Arrays) -> None:
    x, y, xv, yv = wine
    ctx = TrialContext(max_epochs=3, num_threads=2)
    epochs = list(search.keras.fit(build(), ctx, x, y, validation_data=(xv, yv), **FIT))
    assert len(epochs) == 3
    for metrics in epochs:
        assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(metrics)
        assert all(type(v) is float for v in metrics.values())
    assert not fit_threads()
    plain = build().fit(x, y, validation_data=(xv, yv), epochs=3, verbose=0, **FIT).history
    assert [e["val_loss"] for e in epochs] == plain["val_loss"]  # just what fit itself gives


def test_closing_the_generator_stops_training(wine: Arrays) -> None:
    x, y, xv, yv = wine
    rec = Recorder()
    ctx = TrialContext(max_epochs=10, num_threads=2)
    run = search.keras.fit(build(), ctx, x, y, validation_data=(xv, yv), callbacks=[rec], **FIT)
    next(run), next(run)
    assert len(fit_threads()) == 1 and rec.epochs == [0, 1]  # paused after epoch 2
    run.close()  # what ASHA's prune does
    assert not fit_threads()
    assert rec.epochs == [0, 1] and rec.train_begins == rec.train_ends == 1


def test_user_early_stopping_keeps_its_state_in_one_fit(wine: Arrays) -> None:
    x, y, xv, yv = wine
    rec = Recorder()
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2)
    ctx = TrialContext(max_epochs=10, num_threads=2)
    model = build(lr=0.0)  # nothing moves: val_loss never improves after epoch 1
    epochs = list(
        search.keras.fit(model, ctx, x, y, validation_data=(xv, yv), callbacks=[stop, rec], **FIT)
    )
    assert len(epochs) == 3 and stop.stopped_epoch == 2
    assert rec.train_begins == 1 and rec.epochs == [0, 1, 2]
    assert not fit_threads()


def test_checkpoint_then_restore_continues(wine: Arrays, tmp_path: Path) -> None:
    x, y, xv, yv = wine
    val: dict[str, Any] = {"validation_data": (xv, yv), **FIT}
    first, stop1 = build(), keras.callbacks.EarlyStopping(monitor="val_loss", patience=5)
    ctx1 = TrialContext(max_epochs=4, num_threads=2, checkpoint_dir=str(tmp_path))
    run = search.keras.fit(first, ctx1, x, y, callbacks=[stop1], **val)
    next(run), next(run)
    run.close()  # the trial dies after epoch 2
    saved, steps = first.get_weights(), int(first.optimizer.iterations)
    assert steps == 2 * 4  # 128 samples, batches of 32
    assert json.loads((tmp_path / "state.json").read_text())["epoch"] == 2

    stop2 = keras.callbacks.EarlyStopping(monitor="val_loss", patience=5)
    rec = Recorder(watch=stop2)
    second = build()
    ctx2 = TrialContext(max_epochs=4, num_threads=2, restore_dir=str(tmp_path), start_epoch=3)
    epochs = list(search.keras.fit(second, ctx2, x, y, callbacks=[stop2, rec], **val))
    assert len(epochs) == 2 and rec.epochs == [2, 3]
    assert all(np.array_equal(a, b) for a, b in zip(rec.begin_weights[0], saved, strict=True))
    assert rec.begin_steps == [8, 12]
    assert rec.watched[0] == stop1.best < np.inf  # the patience counters came back too
    assert not fit_threads()
    with pytest.raises(ValueError, match="built model"):  # nothing to load the weights into
        next(search.keras.fit(build(with_input=False), ctx2, x, y, **val))


def test_an_error_in_fit_reaches_the_caller(wine: Arrays) -> None:
    x, y, xv, yv = wine
    rec = Recorder(fail_at=2)
    ctx = TrialContext(max_epochs=5, num_threads=2)
    run = search.keras.fit(build(), ctx, x, y, validation_data=(xv, yv), callbacks=[rec], **FIT)
    assert "loss" in next(run)
    with pytest.raises(FloatingPointError, match="boom at epoch 2"):
        next(run)
    assert not fit_threads()


def test_epochs_come_from_the_context(wine: Arrays) -> None:
    x, y, _, _ = wine
    run = search.keras.fit(build(), TrialContext(max_epochs=2), x, y, epochs=5)
    with pytest.raises(TypeError, match="epochs"):
        next(run)


def test_train_to_end_and_train_and_save(wine: Arrays, tmp_path: Path) -> None:
    x, y, xv, yv = wine
    data = Dataset(x, y, xv, yv, num_classes=3, name="wine")

    def train(config: Any, data: Dataset, ctx: TrialContext) -> Any:
        model = build(lr=config["lr"])
        return (
            yield from search.keras.fit(
                model, ctx, data.x_train, data.y_train, validation_data=(data.x_val, data.y_val)
            )
        )

    history: list[dict[str, float]] = []
    ctx = TrialContext(max_epochs=2, num_threads=2, history=history)
    trained = train_to_end(train, {"lr": 1e-2}, data, ctx)
    assert isinstance(trained.model, keras.Model) and trained.epochs == 2 and len(history) == 2
    assert trained.metrics == history[-1]

    metrics = search.keras.train_and_save(train, {"lr": 1e-2}, data, ctx, tmp_path / "out")
    assert metrics["epochs"] == 2.0 and "val_loss" in metrics
    reloaded = keras.models.load_model(tmp_path / "out" / "model.keras")
    assert reloaded.predict(xv, verbose=0).shape == (len(yv), 3)
    # model.onnx, checked against Keras, and a bundle the check accepts on the shipped rows
    from search.contract.inputs import read_inputs
    from search.handover.check import check_bundle

    out = tmp_path / "out"
    assert metrics["onnx_max_abs_diff"] <= search.keras.ONNX_TOLERANCE
    declared = read_inputs(out)
    assert declared is not None and declared.model == "model.onnx"
    assert declared.validation == "validation.npz"
    keras_accuracy = float((reloaded.predict(xv, verbose=0).argmax(1) == yv).mean())
    assert declared.validation_accuracy == pytest.approx(keras_accuracy)
    assert metrics["onnx_val_accuracy"] == pytest.approx(keras_accuracy, abs=1 / len(yv))
    (out / "metrics.json").write_text(json.dumps({"final": {"val_accuracy": 0.0}}))
    lines = check_bundle(out)
    assert lines[-1] == "OK: model.onnx reproduces the exported validation accuracy"


def test_train_and_save_declares_the_loaders_standardization_and_the_classes(
    wine: Arrays, tmp_path: Path
) -> None:
    """The one-line hook takes ``mean=``, ``std=`` and ``classes=``: ``inputs.json`` declares
    them, so the served model standardizes raw rows and answers class names (before, a loader's
    standardization was lost and raw rows got another class, silently)."""
    from search.contract.inputs import read_inputs

    x, y, xv, yv = wine
    data = Dataset(x, y, xv, yv, num_classes=3, name="wine")

    def train(config: Any, data: Dataset, ctx: TrialContext) -> Any:
        return (yield from search.keras.fit(build(), ctx, data.x_train, data.y_train))

    mean, std = [0.5] * x.shape[1], [2.0] * x.shape[1]
    names = ["cultivar-a", "cultivar-b", "cultivar-c"]
    out = tmp_path / "out"
    ctx = TrialContext(max_epochs=1, num_threads=2)
    search.keras.train_and_save(train, {}, data, ctx, out, mean=mean, std=std, classes=names)
    declared = read_inputs(out)
    assert declared is not None and declared.classes == tuple(names)
    assert list(declared.inputs[0].mean) == mean and list(declared.inputs[0].std) == std


def test_export_compares_a_user_hooks_onnx_with_its_keras_file(
    wine: Arrays, tmp_path: Path
) -> None:
    """A hook that wrote model.keras and model.onnx: export's comparison reloads the Keras
    file and runs both on random and shipped rows; a wrong ONNX file shows a large difference."""
    from search.handover.compare import TOLERANCE, onnx_against_keras

    _, _, xv, yv = wine
    model = build()
    model.predict(xv[:2], verbose=0)
    search.keras.save_model(model, tmp_path)
    assert onnx_against_keras(tmp_path) == {}  # no model.onnx: nothing to compare
    search.keras.save_onnx(model, tmp_path, xv, yv)
    found = onnx_against_keras(tmp_path)
    assert found["onnx_max_abs_diff"] <= TOLERANCE
    accuracy = float((model.predict(xv, verbose=0).argmax(1) == yv).mean())
    assert found["onnx_val_accuracy"] == pytest.approx(accuracy, abs=1 / len(yv))

    keras.utils.set_random_seed(1)
    other = keras.Sequential([keras.Input((13,)), keras.layers.Dense(3)])
    search.keras._to_onnx(other, tmp_path / "model.onnx")
    assert onnx_against_keras(tmp_path)["onnx_max_abs_diff"] > TOLERANCE
