"""search.hf: a user's Hugging Face Trainer run once in a thread, one yield per epoch.

The tiny BERT of ``examples/hf_text`` on 64 generated sequences, no Ray.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import search.hf  # noqa: E402
from examples.hf_text import text  # noqa: E402
from search.contract import TrialContext  # noqa: E402

pytestmark = pytest.mark.torch

Data = dict[str, Any]


@pytest.fixture(scope="module")
def data() -> Data:
    return text.load(seed=0, train_size=64, val_size=32)


def trainer(data: Data, ctx: TrialContext, **config: Any) -> Any:
    from transformers import Trainer, set_seed

    set_seed(0)
    return Trainer(
        model=text.build(),
        args=search.hf.training_args({"lr": 5e-3, "batch_size": 32, **config}, ctx),
        train_dataset=text.dataset(data["x_train"], data["y_train"]),
        eval_dataset=text.dataset(data["x_val"], data["y_val"]),
        compute_metrics=text.accuracy,
    )


def train_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("hf-train-")]


def test_every_epoch_yields_float_eval_metrics(data: Data) -> None:
    ctx = TrialContext(max_epochs=2, num_threads=2)
    epochs = list(search.hf.train(trainer(data, ctx), ctx))
    assert [e["epoch"] for e in epochs] == [1.0, 2.0]
    for metrics in epochs:
        assert {"eval_loss", "eval_accuracy"} <= set(metrics)
        assert "eval_runtime" not in metrics  # timings would make a rerun differ
        assert all(type(v) is float for v in metrics.values())
    assert not train_threads()


def test_the_trainers_log_dicts_stay_off_the_console(
    data: Data, capfd: pytest.CaptureFixture[str]
) -> None:
    ctx = TrialContext(max_epochs=1, num_threads=2)
    assert len(list(search.hf.train(trainer(data, ctx), ctx))) == 1
    out, err = capfd.readouterr()
    assert "'loss'" not in out + err and "'eval_loss'" not in out + err, out + err


def test_closing_the_generator_stops_training(data: Data) -> None:
    ctx = TrialContext(max_epochs=10, num_threads=2)
    hf = trainer(data, ctx)
    run = search.hf.train(hf, ctx)
    assert next(run)["epoch"] == 1.0
    assert len(train_threads()) == 1  # paused after epoch 1
    run.close()  # what ASHA's prune does
    assert not train_threads()
    assert hf.state.epoch == 1.0 and hf.state.global_step == 2  # 64 rows, batches of 32


def test_a_restored_trial_resumes_from_its_last_checkpoint(data: Data, tmp_path: Path) -> None:
    first = TrialContext(max_epochs=2, num_threads=2, checkpoint_dir=str(tmp_path))
    run = search.hf.train(trainer(data, first), first)
    next(run)  # the checkpoint is written before the epoch is handed out
    run.close()
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-2"]
    again = TrialContext(max_epochs=2, num_threads=2, restore_dir=str(tmp_path), start_epoch=2)
    hf = trainer(data, again)
    assert [e["epoch"] for e in search.hf.train(hf, again)] == [2.0]
    assert hf.state.global_step == 4


def test_training_args_map_the_knobs_and_the_context(tmp_path: Path) -> None:
    ctx = TrialContext(max_epochs=4, seed=7, checkpoint_dir=str(tmp_path))
    knobs = {"lr": 0.01, "batch_size": 8, "weight_decay": 0.1, "lr_scheduler": "cosine"}
    args = search.hf.training_args({**knobs, "precision": "bf16"}, ctx, logging_steps=3)
    assert (args.learning_rate, args.weight_decay, args.lr_scheduler_type) == (
        0.01,
        0.1,
        "cosine",
    )
    assert args.per_device_train_batch_size == args.per_device_eval_batch_size == 8
    assert args.bf16 and not args.fp16 and args.use_cpu
    assert (args.num_train_epochs, args.seed, args.output_dir) == (4, 7, str(tmp_path))
    assert (args.eval_strategy, args.save_strategy, args.save_total_limit) == (
        "epoch",
        "epoch",
        1,
    )
    assert args.report_to == [] and args.disable_tqdm and args.logging_steps == 3
    plain = search.hf.training_args({"learning_rate": 0.02, "lr_scheduler": "none"}, ctx)
    assert (plain.learning_rate, plain.lr_scheduler_type, plain.bf16) == (0.02, "constant", False)
    bare = search.hf.training_args({}, TrialContext(max_epochs=1))
    assert bare.save_strategy == "no"  # nothing to save into without a checkpoint_dir


def test_without_transformers_a_call_says_what_to_install(monkeypatch: Any) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "transformers" else real(name, *a),
    )
    with pytest.raises(ModuleNotFoundError, match=r"^search.hf needs transformers: pip install"):
        search.hf.training_args({}, TrialContext(max_epochs=1))
    with pytest.raises(ModuleNotFoundError, match="pip install -e '.\\[hf\\]'"):
        next(search.hf.train(object(), TrialContext(max_epochs=1)))
