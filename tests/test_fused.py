"""Fused arrays (issue 44): K trials of the digits CNN trained as one model give each trial the
curve it gets alone (``trainables/torch/fused.py``, ``trainables/torch/fused_loop.py``).

Every comparison is against the unfused built-in itself (``torch_cnn``'s ``train``, the code a
trial runs today) with the same config and seed. The tolerance is float rounding: a grouped
convolution and a batched matrix product sum in another order than K separate layers. In
float64 (torch's default dtype set for the test; model and data follow it) the math is shown
equal: every value of three epochs agrees to 1e-6 relative (the floor: both compute the
cross-entropy in float32, as the built-ins do for mixed precision). In float32 the rounding
differences of about 1e-7 grow with training (Adam at lr 1e-2 turns them into 2.6 % of
val_loss by epoch 3, as two float32 runs in another summation order would), so float32 is
checked on the first epoch, to 1e-3. Dropout is 0 where curves are compared: under fusion
its masks are drawn from the same distribution, not the same draws (each member's own
``dropout``, ``augment`` and ``hflip`` are checked beside a member without them).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from search.contract import TrialContext  # noqa: E402
from search.contract.dataset import Dataset, load_digits  # noqa: E402
from trainables.knobs import read_config  # noqa: E402
from trainables.torch import cnn  # noqa: E402
from trainables.torch.fused_loop import (  # noqa: E402
    FusedArray,
    array_key,
    fused_tensors,
    shape_key,
)

pytestmark = pytest.mark.torch

EPOCHS = 3
COMPARED = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "grad_norm",
            "grad_norm_applied", "lr")  # fmt: skip
SHAPE = {"channels": 4, "batch_size": 64, "dropout": 0.0}
MEMBERS = [  # what differs inside one array: every per-member knob, over three members
    {"lr": 3e-3, "weight_decay": 1e-4, "lr_scheduler": "cosine", "clip_norm": 0.5},
    {"lr": 1e-2, "momentum": 0.9, "l1": 1e-5, "lr_scheduler": "cyclic", "clip_value": 0.05},
    {"lr": 5e-4, "lr_scheduler": "plateau", "gamma": 0.5, "weight_decay": 1e-3,
     "early_stopping_patience": 2},
]  # fmt: skip


@pytest.fixture(scope="module")
def digits() -> Dataset:
    """640 training digits (10 steps of 64) and the whole validation split."""
    data = load_digits(0.2, 0)
    return replace(data, x_train=data.x_train[:640], y_train=data.y_train[:640])


@pytest.fixture
def float64() -> Any:
    """torch's default dtype float64 for one test: the built-ins' models and data follow it."""
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def _cfg(optimizer: str, knobs: dict[str, Any]) -> dict[str, Any]:
    return read_config({**SHAPE, "optimizer": optimizer, **knobs}, cnn.DEFAULTS)


def alone(cfg: dict[str, Any], data: Dataset, seed: int) -> list[dict[str, float]]:
    """The unfused trial: ``torch_cnn`` as a trial runs it."""
    return list(cnn.train(cfg, data, TrialContext(max_epochs=EPOCHS, seed=seed, num_threads=1)))


def fused(
    cfgs: list[dict[str, Any]], data: Dataset, seeds: list[int], **hooks: Any
) -> dict[int, list[dict[str, float]]]:
    """Each slot's curve in one array, run to its members' ends; ``before_epoch(array, n)``
    may change slots between epochs."""
    ctxs = [TrialContext(max_epochs=EPOCHS, seed=s) for s in seeds]
    array = FusedArray(
        cnn.build_model,
        fused_tensors(data, "cpu"),
        list(zip(cfgs, ctxs, strict=True)),
        micro_batch=hooks.get("micro_batch"),
    )
    curves: dict[int, list[dict[str, float]]] = {k: [] for k in range(len(cfgs))}
    for n in range(2 * EPOCHS):
        if "before_epoch" in hooks:
            hooks["before_epoch"](array, n, curves)
        for slot, row in array.epoch().items():
            curves[slot].append(row)
    return curves


def assert_same(
    got: list[dict[str, float]], want: list[dict[str, float]], rel: float = 1e-6
) -> None:
    assert len(got) == len(want)
    for epoch, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        for key in COMPARED:
            assert g[key] == pytest.approx(w[key], rel=rel, abs=rel), (epoch, key)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_each_member_learns_the_curve_it_learns_alone(digits: Dataset, optimizer: str) -> None:
    cfgs = [_cfg(optimizer, m) for m in MEMBERS]
    seeds = [11, 12, 13]
    curves = fused(cfgs, digits, seeds)
    for slot, (cfg, seed) in enumerate(zip(cfgs, seeds, strict=True)):
        assert_same(curves[slot], alone(cfg, digits, seed))
    # the members really differ: the same seed and knobs would not make this test pass
    assert len({round(c[-1]["val_loss"], 6) for c in curves.values()}) == 3


@pytest.mark.usefixtures("float64")
def test_members_of_three_optimizer_families_share_an_array_and_learn_their_own_curves(
    digits: Dataset,
) -> None:
    """``optimizer`` is a per-member knob: SGD with momentum, Adam and AdamW in one array,
    each with its own state (a slot refilled with another family starts its own)."""
    cfgs = [_cfg(family, m) for family, m in zip(["sgd", "adam", "adamw"], MEMBERS, strict=True)]
    assert len({shape_key(c) for c in cfgs}) == 1
    newcomer = _cfg("sgd", {"lr": 2e-3, "momentum": 0.5, "weight_decay": 1e-4})

    def refill_slot_2(array: FusedArray, n: int, curves: dict[int, list[Any]]) -> None:
        if n == 1:  # the AdamW trial was pruned: an SGD trial takes its slot
            curves[2].append("pruned")
            array.assign(2, newcomer, TrialContext(max_epochs=EPOCHS, seed=98))

    curves = fused(cfgs, digits, [41, 42, 43], before_epoch=refill_slot_2)
    assert_same(curves[0], alone(cfgs[0], digits, 41))
    assert_same(curves[1], alone(cfgs[1], digits, 42))
    assert_same(curves[2][:1], alone(cfgs[2], digits, 43)[:1])
    assert_same(curves[2][2:], alone(newcomer, digits, 98))


@pytest.mark.usefixtures("float64")
def test_dropout_and_augmentation_are_each_members_own(digits: Dataset) -> None:
    """Members that differ only in ``dropout``, ``augment`` and ``hflip`` share an array; the
    one without them learns exactly its unfused curve beside them, and theirs differ from it
    (their draws come from the same distributions as unfused, not the same draws)."""
    plain = _cfg("adam", MEMBERS[0])
    noisy = [{**plain, "dropout": 0.3}, {**plain, "augment": 0.3, "hflip": True}]
    assert {shape_key(c) for c in noisy} == {shape_key(plain)}
    curves = fused([plain, *noisy], digits, [51, 51, 51])
    assert_same(curves[0], alone(plain, digits, 51))
    for slot in (1, 2):  # the same seed and config but for the knob: another curve
        assert curves[slot][0]["train_loss"] != pytest.approx(curves[0][0]["train_loss"])


@pytest.mark.usefixtures("float64")
def test_batch_sizes_that_are_multiples_of_the_arrays_accumulate_and_learn_their_own_curves(
    digits: Dataset,
) -> None:
    """Batches of 32, 64 and 128 in an array of 32-image steps: the 64 and 128 members sum
    their gradients over 2 and 4 steps, then step (their schedules per step, their clipping
    on the summed gradient). 600 images: each member's last batch is partial (24, 24, 88
    images), so the pieces' weights are checked too. Every curve is its unfused trial's."""
    data = replace(digits, x_train=digits.x_train[:600], y_train=digits.y_train[:600])
    knobs = [MEMBERS[1], {**MEMBERS[0], "lr_scheduler": "onecycle"}, MEMBERS[2]]
    cfgs = [{**_cfg("sgd", m), "batch_size": b} for m, b in zip(knobs, (32, 64, 128), strict=True)]
    assert len({array_key(c, 32) for c in cfgs}) == 1
    curves = fused(cfgs, data, [61, 62, 63], micro_batch=32)
    for slot, (cfg, seed) in enumerate(zip(cfgs, [61, 62, 63], strict=True)):
        assert_same(curves[slot], alone(cfg, data, seed))
    assert array_key({**cfgs[0], "batch_size": 48}, 32) != array_key(cfgs[0], 32)


def test_in_float32_the_first_epoch_agrees_to_rounding(digits: Dataset) -> None:
    cfgs = [_cfg("adam", m) for m in MEMBERS]
    curves = fused(cfgs, digits, [1, 2, 3])
    for slot, cfg in enumerate(cfgs):
        (first, *_) = alone(cfg, digits, slot + 1)
        for key in ("train_loss", "val_loss", "grad_norm", "lr"):
            assert curves[slot][0][key] == pytest.approx(first[key], rel=1e-3), (slot, key)


def test_a_members_weights_are_its_unfused_models(digits: Dataset) -> None:
    cfg, seed = _cfg("adam", MEMBERS[0]), 5
    ctx = TrialContext(max_epochs=1, seed=seed)
    array = FusedArray(cnn.build_model, fused_tensors(digits, "cpu"), [(cfg, ctx), (cfg, ctx)])
    torch.manual_seed(seed)
    model = cnn.build_model(cfg, array.tensors)
    before = array.member_state(1)
    assert before.keys() == model.state_dict().keys()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    array.epoch()
    model.load_state_dict(array.member_state(1))  # a checkpoint or an export reads it so
    assert not torch.equal(model.state_dict()["1.weight"], before["1.weight"])


@pytest.mark.usefixtures("float64")
def test_a_slot_refilled_after_a_prune_leaves_the_other_members_unchanged(
    digits: Dataset,
) -> None:
    cfgs = [_cfg("adam", m) for m in MEMBERS[:2]]
    newcomer = _cfg("adam", {"lr": 2e-3})

    def prune_slot_1(array: FusedArray, n: int, curves: dict[int, list[Any]]) -> None:
        if n == 1:  # ASHA stopped slot 1's trial after its first epoch: the next trial takes it
            curves[1].append("pruned")
            array.assign(1, newcomer, TrialContext(max_epochs=EPOCHS, seed=99))

    curves = fused(cfgs, digits, [21, 22], before_epoch=prune_slot_1)
    assert_same(curves[0], alone(cfgs[0], digits, 21))
    first, new = curves[1][:1], curves[1][2:]
    assert curves[1][1] == "pruned"
    assert_same(first, alone(cfgs[1], digits, 22)[:1])
    assert_same(new, alone(newcomer, digits, 99))  # a fresh optimizer state and schedule


@pytest.mark.usefixtures("float64")
def test_a_member_whose_loss_turns_nan_fails_alone(digits: Dataset) -> None:
    good = _cfg("sgd", {"lr": 1e-2, "momentum": 0.9})
    diverging = _cfg("sgd", {"lr": 1e6, "momentum": 0.9})
    curves = fused([good, diverging, good], digits, [31, 32, 33])
    assert any(math.isnan(row["train_loss"]) for row in curves[1])
    assert_same(curves[0], alone(good, digits, 31))
    assert_same(curves[2], alone(good, digits, 33))


def test_an_array_refuses_a_member_of_another_shape(digits: Dataset) -> None:
    cfg = _cfg("adam", {})
    other = _cfg("adam", {"channels": 8})
    assert shape_key(cfg) != shape_key(other)
    assert shape_key(cfg) == shape_key(_cfg("adam", MEMBERS[0]))
    ctx = TrialContext(max_epochs=1)
    with pytest.raises(ValueError, match="shape"):
        FusedArray(cnn.build_model, fused_tensors(digits, "cpu"), [(cfg, ctx), (other, ctx)])


def test_the_step_benchmark_measures_fused_and_unfused_epochs() -> None:
    """``benchmarks/fused.py --step`` (the device command's code path) at a tiny size."""
    from benchmarks.fused import step_rates

    rows = step_rates([1, 2], "cpu", channels=4)
    assert [r["members"] for r in rows] == [1, 2]
    assert all(
        r["fused_images_per_s"] > 0 and r["one_after_another_images_per_s"] > 0 for r in rows
    )


def test_the_modules_examples_run() -> None:
    """The fused modules' doctests (``make test`` collects doctests under ``search/`` only)."""
    import doctest

    from trainables.torch import fused as fused_module
    from trainables.torch import fused_host, fused_loop

    for module in (fused_module, fused_loop, fused_host):
        result = doctest.testmod(
            module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        )
        assert result.attempted > 0 and result.failed == 0, module.__name__
