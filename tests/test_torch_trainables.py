"""The PyTorch trainables, run for real on the digits (no Ray, no mocks, a few epochs each)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from search.compute.job import TrialJob, trial_context  # noqa: E402
from search.contract import TrialContext  # noqa: E402
from search.contract.dataset import Dataset, load_digits  # noqa: E402
from trainables.torch import cnn as torch_cnn  # noqa: E402
from trainables.torch import common as torch_common  # noqa: E402
from trainables.torch import rnn as torch_rnn  # noqa: E402
from trainables.torch import transfer as torch_transfer  # noqa: E402
from trainables.torch.data import to_tensors  # noqa: E402
from trainables.torch.loop import fit_epochs, load_state, make_fitting  # noqa: E402

pytestmark = pytest.mark.torch

KEYS = {"train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr"}
SMALL_CNN = {"channels": 8, "lr": 3e-3}


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_digits(0.2, 0)


@pytest.fixture(scope="module")
def few_digits(digits: Dataset) -> Dataset:
    """192 training and 96 validation digits: enough to see weights move, fast for a ResNet."""
    return replace(
        digits,
        x_train=digits.x_train[:192],
        y_train=digits.y_train[:192],
        x_val=digits.x_val[:96],
        y_val=digits.y_val[:96],
    )


def run(
    train: Any, config: dict[str, Any], data: Dataset, epochs: int = 2, **ctx: Any
) -> list[dict[str, float]]:
    context = TrialContext(max_epochs=epochs, num_threads=1, **ctx)
    return list(train(config, data, context))


def finite(rows: list[dict[str, float]]) -> bool:
    return all(math.isfinite(r["train_loss"]) and math.isfinite(r["val_loss"]) for r in rows)


@pytest.fixture(scope="module")
def resnet_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A resnet18 state_dict file (random weights: the freezing tests need no pretraining)."""
    path = tmp_path_factory.mktemp("weights") / "resnet18.pt"
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    return str(path)


@pytest.mark.parametrize("name", ["cnn", "rnn", "transfer"])
def test_each_trainable_yields_the_metric_keys_every_epoch(name, digits, few_digits, resnet_file):
    train, config, data = {
        "cnn": (torch_cnn.train, SMALL_CNN, digits),
        "rnn": (torch_rnn.train, {"hidden": 16}, digits),
        "transfer": (
            torch_transfer.train,
            {"weights_path": resnet_file, "image_size": 16},
            few_digits,
        ),
    }[name]
    rows = run(train, config, data, epochs=2)
    assert len(rows) == 2
    for row in rows:
        assert set(row) >= KEYS
        assert not any(key.startswith("search/") for key in row)
        assert all(isinstance(v, float) for v in row.values())


def test_cnn_reaches_high_accuracy_in_a_few_epochs(digits):
    rows = run(torch_cnn.train, {"lr": 3e-3, "batch_size": 64}, digits, epochs=6)
    assert max(r["val_accuracy"] for r in rows) >= 0.9


@pytest.mark.parametrize("scheduler", torch_common.CHOICES["lr_scheduler"])
def test_every_lr_scheduler_runs(scheduler, digits):
    config = {**SMALL_CNN, "lr_scheduler": scheduler, "step_size": 1, "gamma": 0.5}
    rows = run(torch_cnn.train, config, digits, epochs=3)
    assert len(rows) == 3 and finite(rows)
    lrs = [r["lr"] for r in rows]
    if scheduler == "none":
        assert lrs == [3e-3] * 3
    if scheduler == "step":
        assert lrs == pytest.approx([3e-3, 1.5e-3, 0.75e-3])
    if scheduler in ("cosine", "onecycle", "cyclic"):
        assert len(set(lrs)) > 1


@pytest.mark.parametrize(
    "knobs",
    [
        {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4},
        {"optimizer": "adamw", "weight_decay": 0.05, "dropout": 0.3},
        {"l1": 1e-4, "clip_value": 0.5, "clip_norm": 1.0},
        {"num_workers": 1, "augment": 0.3},
    ],
)
def test_optimizers_penalties_and_loader_options_train(knobs, few_digits):
    rows = run(torch_cnn.train, {**SMALL_CNN, **knobs}, few_digits, epochs=3)
    assert finite(rows) and rows[-1]["train_loss"] < rows[0]["train_loss"]


def test_augmentation_changes_training_inputs_but_never_validation(few_digits):
    # lr 0 and no dropout/batch norm: the weights never move, so val_loss depends only on the
    # validation inputs; augmentation must change what training sees and nothing else.
    base = {**SMALL_CNN, "lr": 0.0}
    plain = run(torch_cnn.train, base, few_digits)
    augmented = run(torch_cnn.train, {**base, "augment": 1.0, "hflip": True}, few_digits)
    for p, a in zip(plain, augmented, strict=True):
        assert a["val_loss"] == p["val_loss"] and a["val_accuracy"] == p["val_accuracy"]
        assert a["train_loss"] != p["train_loss"]


def test_augment_draws_per_image_stays_in_range_and_repeats_with_the_seed():
    from trainables.torch.data import build_augment

    assert build_augment(0.0) is None
    image = torch.rand(1, 8, 8)
    augment = build_augment(1.0)
    torch.manual_seed(3)
    first = [augment(image) for _ in range(4)]
    torch.manual_seed(3)
    again = [augment(image) for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert len({tuple(a.flatten().tolist()) for a in first}) == 4  # a fresh draw per call
    assert all(a.shape == image.shape and a.min() >= 0 and a.max() <= 1 for a in first)
    flip = build_augment(0.0, hflip=True)
    seen = {tuple(flip(image).flatten().tolist()) for _ in range(20)}
    assert seen == {tuple(image.flatten().tolist()), tuple(image.flip(-1).flatten().tolist())}


def test_an_augmented_cnn_trial_does_not_import_torchvision():
    # torchvision's import costs a new trial process ~2.5 s (it loads torch._dynamo)
    import subprocess
    import sys

    code = (
        "import sys; from search.contract.dataset import load_digits; "
        "from search.contract import TrialContext; "
        "from trainables.torch.cnn import train; d = load_digits(0.2, 0); "
        "next(train({'channels': 4, 'augment': 0.4, 'hflip': True}, d, "
        "TrialContext(max_epochs=1))); print('torchvision' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_early_stopping_returns_before_max_epochs(digits):
    rows = run(
        torch_cnn.train, {**SMALL_CNN, "lr": 0.0, "early_stopping_patience": 1}, digits, epochs=10
    )
    assert len(rows) == 2  # epoch 1 sets the best val_loss, epoch 2 does not improve on it


def test_clip_norm_bounds_the_applied_gradient_norm(digits):
    rows = run(torch_cnn.train, {**SMALL_CNN, "clip_norm": 0.25}, digits)
    assert all(r["grad_norm_applied"] <= 0.25 * (1 + 1e-4) for r in rows)
    assert max(r["grad_norm"] for r in rows) > 0.25  # clipping really engaged


def test_clip_value_bounds_every_gradient_element():
    layer = torch.nn.Linear(4, 3)
    (layer(torch.full((8, 4), 100.0)).sum() * 10).backward()
    params = list(layer.parameters())
    before = torch_common.clip_gradients(params, clip_norm=0.0, clip_value=0.1)
    assert before > 1.0
    assert all(p.grad.abs().max() <= 0.1 for p in params)


def test_fp16_on_cpu_raises_a_clear_error(digits):
    message = "^precision fp16 needs a CUDA device; use bf16 or fp32 on CPU$"
    with pytest.raises(ValueError, match=message):
        run(torch_cnn.train, {"precision": "fp16"}, digits)


@pytest.mark.parametrize("train", [torch_cnn.train, torch_rnn.train])
def test_bf16_autocast_runs_on_cpu(train, digits):
    rnn = {"cell": "lstm", "hidden": 16, "lr": 3e-3}
    config = SMALL_CNN if train is torch_cnn.train else rnn
    rows = run(train, {**config, "precision": "bf16"}, digits)
    assert finite(rows) and rows[-1]["val_accuracy"] > 0.3


@pytest.mark.parametrize(("cell", "lr"), [("gru", 10.0), ("lstm", 30.0)])
def test_rnn_explodes_at_high_lr_without_clipping_and_stays_finite_with_it(cell, lr, digits):
    config = {"cell": cell, "hidden": 64, "optimizer": "sgd", "lr": lr}
    assert not finite(run(torch_rnn.train, config, digits, epochs=3))
    assert finite(run(torch_rnn.train, {**config, "clip_norm": 1.0}, digits, epochs=3))


def fit_transfer(config: dict[str, Any], data: Dataset) -> tuple[dict, dict]:
    """One epoch of the transfer trainable's own model and loop: resnet18 state before and after."""
    ctx = TrialContext(max_epochs=1, num_threads=1)
    cfg, device = torch_common.setup(
        {"image_size": 16, **config}, torch_transfer.DEFAULTS, ctx, torch_transfer.BACKBONES
    )
    tensors = to_tensors(data)
    model = torch_transfer.build_model(cfg, tensors)
    before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    list(fit_epochs(model, tensors, cfg, ctx, device))
    return before, model.backbone.state_dict()


def changed(before: dict, after: dict, prefix: str) -> bool:
    """Whether any tensor (parameter or batch-norm statistic) under ``prefix`` changed."""
    keys = [k for k in before if k.startswith(prefix)]
    assert keys, prefix
    return any(not torch.equal(before[k], after[k]) for k in keys)


def test_frozen_backbone_stays_unchanged_and_the_head_learns(few_digits, resnet_file):
    before, after = fit_transfer({"weights_path": resnet_file, "freeze_backbone": True}, few_digits)
    assert changed(before, after, "fc.")  # the new head
    backbone = [k for k in before if not k.startswith("fc.")]
    assert any("running_mean" in k for k in backbone)
    assert all(torch.equal(before[k], after[k]) for k in backbone)


def test_unfrozen_backbone_and_unfrozen_blocks_change(few_digits, resnet_file):
    config = {"weights_path": resnet_file, "freeze_backbone": False}
    before, after = fit_transfer(config, few_digits)
    assert changed(before, after, "conv1.") and changed(before, after, "layer1.")
    config = {"weights_path": resnet_file, "freeze_backbone": True, "unfreeze_blocks": 1}
    before, after = fit_transfer(config, few_digits)
    assert changed(before, after, "layer4.") and not changed(before, after, "layer3.")


def test_pretrained_backbone_file_loads_into_the_trainable(tmp_path, few_digits, resnet_file):
    path = torch_transfer.pretrain_backbone(
        tmp_path / "mb.pt", backbone="mobilenet_v3_small", epochs=1, image_size=16
    )
    config = {"backbone": "mobilenet_v3_small", "weights_path": path, "image_size": 16}
    rows = run(torch_transfer.train, config, few_digits, epochs=1)
    assert finite(rows)
    with pytest.raises(ValueError, match="not a mobilenet_v3_small state_dict"):
        run(torch_transfer.train, {**config, "weights_path": resnet_file}, few_digits, epochs=1)


def test_profiling_writes_a_chrome_trace_for_the_chosen_trial_only(tmp_path, digits):
    job = TrialJob("torch_cnn", 2, profile=True, profile_trial=3)
    for number in (3, 4):  # the spec's profile_trial: 3 chooses trial 3 only
        ctx = trial_context(job, seed=0, number=number, trial_dir=str(tmp_path))
        list(torch_cnn.train(SMALL_CNN, digits, ctx))
    trace = json.loads((tmp_path / "profile-trial3.json").read_text())
    assert trace["traceEvents"]
    assert not (tmp_path / "profile-trial4.json").exists()


def test_same_seed_gives_identical_metrics(few_digits):
    config = {**SMALL_CNN, "augment": 0.5, "dropout": 0.2}

    def metrics(seed: int) -> list[dict[str, float]]:
        rows = run(torch_cnn.train, config, few_digits, seed=seed)
        # measured durations differ run to run, and the second run finds the data loaded
        timings = ("epoch_time_s", "latency_ms", "train_images_per_s", "data_cached")
        return [{k: v for k, v in r.items() if k not in timings} for r in rows]

    assert metrics(7) == metrics(7)
    assert metrics(7) != metrics(8)


def test_unknown_keys_and_bad_choices_are_rejected(digits):
    with pytest.raises(ValueError, match="unknown config key"):
        run(torch_cnn.train, {"learning_rate": 0.1}, digits)
    with pytest.raises(ValueError, match="optimizer must be one of sgd, adam, adamw"):
        run(torch_cnn.train, {"optimizer": "rmsprop"}, digits)


def test_checkpoint_restores_model_optimizer_and_epoch(tmp_path, digits):
    """A retried trial continues after its last checkpoint instead of starting over."""
    cfg = {
        "optimizer": "adam",
        "lr": 3e-3,
        "batch_size": 64,
        "channels": 8,
        "lr_scheduler": "step",
        "early_stopping_patience": 5,
    }
    saved = tmp_path / "ckpt"
    saved.mkdir()
    first = TrialContext(max_epochs=3, seed=0, checkpoint_dir=str(saved))
    rows = list(torch_cnn.train(cfg, digits, first))
    assert (saved / "state.pt").exists()
    state = torch.load(saved / "state.pt", weights_only=True)
    assert state["epoch"] == 3 and state["scheduler"] is not None

    resumed_ctx = TrialContext(max_epochs=5, seed=0, restore_dir=str(saved), start_epoch=4)
    resumed = list(torch_cnn.train(cfg, digits, resumed_ctx))
    fresh = list(torch_cnn.train(cfg, digits, TrialContext(max_epochs=1, seed=0)))
    assert len(resumed) == 2  # epochs 4 and 5 only
    assert resumed[0]["val_accuracy"] > fresh[0]["val_accuracy"] + 0.05
    assert resumed[0]["val_accuracy"] >= rows[-1]["val_accuracy"] - 0.05


def test_a_checkpoint_holds_early_stopping_updated_with_its_own_epoch(tmp_path, few_digits):
    """The stopper counts the epoch before the state is saved, so a retried trial's early
    stopping is not one epoch behind: it stops at the epoch an uninterrupted trial does."""
    config = {**SMALL_CNN, "lr": 0.0, "early_stopping_patience": 2}  # val_loss never improves
    saved = tmp_path / "ckpt"
    saved.mkdir()
    rows = run(torch_cnn.train, config, few_digits, epochs=2, checkpoint_dir=str(saved))
    replay = torch_common.EarlyStopping(patience=2)
    for row in rows:
        replay.update(row["val_loss"])
    cfg = torch_common.read_config(config, torch_cnn.DEFAULTS)
    model = torch_cnn.build_model(cfg, to_tensors(few_digits))
    fit = make_fitting(model, cfg, TrialContext(max_epochs=2), torch.device("cpu"), 3)
    restored = torch_common.EarlyStopping(patience=2)
    assert load_state(fit, restored, str(saved)) == 2
    assert (restored.best, restored.bad_epochs) == (replay.best, replay.bad_epochs)
    assert (restored.best, restored.bad_epochs) == (rows[0]["val_loss"], 1)

    whole = run(torch_cnn.train, config, few_digits, epochs=10)
    resumed = run(
        torch_cnn.train, config, few_digits, epochs=10, restore_dir=str(saved), start_epoch=3
    )
    assert len(whole) == 3  # best at epoch 1, two epochs without improvement
    assert len(resumed) == 1  # epoch 3 only, as in the uninterrupted trial


def test_cost_metrics_are_yielded_with_every_epoch(few_digits):
    rows = run(torch_cnn.train, SMALL_CNN, few_digits, epochs=2)
    model = torch_cnn.build_model({**torch_cnn.DEFAULTS, **SMALL_CNN}, to_tensors(few_digits))
    params = sum(p.numel() for p in model.parameters())
    for row in rows:  # measured once, after the first epoch: the same in every epoch
        assert row["params"] == params and row["model_mb"] == params * 4 / 2**20
        assert 0 < row["latency_ms"] == rows[0]["latency_ms"]
