"""The data on the device: one load per process, batches augmented as the per-image reference.

Runs on the CPU (the device path is the same code on a GPU, ``data_placement: device``
forces it here): the per-process cache, the batched crop and flip against
:class:`trainables.torch.data.Augment`'s per-image ones, and the batches' determinism.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from search.contract import TrialContext  # noqa: E402
from search.contract.dataset import load_digits, load_shapes  # noqa: E402
from trainables.torch import device_data  # noqa: E402
from trainables.torch.data import Augment, crop_one, to_tensors  # noqa: E402
from trainables.torch.device_data import (  # noqa: E402
    DeviceBatches,
    random_crop,
    random_flip,
    trial_tensors,
)

pytestmark = pytest.mark.torch

CPU = torch.device("cpu")


@pytest.fixture
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> device_data._Cache:
    cache = device_data._Cache()
    monkeypatch.setattr(device_data, "CACHE", cache)
    return cache


def test_the_same_data_is_loaded_once_per_process_whatever_copy_a_trial_gets(
    fresh_cache: device_data._Cache,
) -> None:
    ctx = TrialContext(max_epochs=1)
    data = load_digits(0.2, 0)
    first = trial_tensors(data, ctx, CPU)
    copy = dataclasses.replace(data, x_train=data.x_train.copy(), y_train=data.y_train.copy())
    second = trial_tensors(copy, ctx, CPU)  # what Ray's object store hands the next trial
    assert (first.cached, second.cached) == (False, True)
    assert second.x_train is first.x_train  # the very tensors: no copy, no conversion
    assert (fresh_cache.loads, fresh_cache.hits) == (1, 1)
    other = trial_tensors(load_digits(0.2, 1), ctx, CPU)  # another split: other data
    assert not other.cached and fresh_cache.loads == 2
    share = trial_tensors(load_digits(0.2, 1), ctx, CPU, train_fraction=0.5)
    assert not share.cached and len(share.y_train) < len(other.y_train)
    changed = data.x_train.copy()
    changed[7, 0, 3, 3] += 1.0  # one pixel of a small dataset: hashed whole
    assert not trial_tensors(dataclasses.replace(data, x_train=changed), ctx, CPU).cached


def test_the_batched_crop_equals_the_per_image_crop_at_the_same_shifts() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(16, 3, 12, 10, generator=gen)
    pad = 3
    shifts = torch.randint(-pad, pad + 1, (16, 2), generator=gen)
    batched = random_crop(x, shifts, pad)
    reference = torch.stack(
        [crop_one(x[i], int(s[0]), int(s[1]), pad) for i, s in enumerate(shifts)]
    )
    assert torch.equal(batched, reference)
    assert not torch.equal(batched, x)
    still = random_crop(x, torch.zeros(16, 2, dtype=torch.long), pad)
    assert torch.equal(still, x)  # no shift: the image itself
    last = x.contiguous(memory_format=torch.channels_last)
    assert random_crop(last, shifts, pad).is_contiguous(memory_format=torch.channels_last)


def test_the_per_image_crop_is_what_augment_draws() -> None:
    x = torch.rand(3, 8, 8)
    torch.manual_seed(5)
    out = Augment(0.0, crop=2)(x)
    torch.manual_seed(5)
    down, right = (int(v) for v in torch.randint(-2, 3, (2,)))
    assert torch.equal(out, crop_one(x, down, right, 2))


def test_the_batched_flip_mirrors_exactly_the_drawn_images() -> None:
    x = torch.rand(6, 3, 4, 5)
    flips = torch.tensor([True, False, True, False, False, True])
    out = random_flip(x, flips)
    for i, flip in enumerate(flips.tolist()):
        assert torch.equal(out[i], x[i].flip(-1) if flip else x[i])


def test_device_batches_are_a_function_of_seed_and_epoch_and_split_over_ranks() -> None:
    tensors = to_tensors(load_shapes(0.2, 0, samples=100, image_size=8))
    batches = DeviceBatches(tensors, 16, seed=3, crop=2, hflip=True)
    assert len(batches) == 80 // 16
    batches.set_epoch(2)
    epoch2 = [xb for xb, _ in batches]
    again = DeviceBatches(tensors, 16, seed=3, crop=2, hflip=True)
    again.set_epoch(2)  # a retried trial, in a new process
    assert all(torch.equal(a, b) for a, b in zip(epoch2, (xb for xb, _ in again), strict=True))
    again.set_epoch(3)
    assert not torch.equal(epoch2[0], next(iter(again))[0])
    order, _, _ = batches.draws()
    labels = np.concatenate([yb.numpy() for _, yb in batches])
    assert list(labels) == tensors.y_train[order[:80]].tolist()  # each image once an epoch
    ranks = [DeviceBatches(tensors, 16, 3, rank=r, world=2) for r in (0, 1)]
    halves = [next(iter(b))[1] for b in ranks]
    whole = next(iter(DeviceBatches(tensors, 16, 3)))[1]
    assert torch.equal(torch.stack(halves, 1).flatten(), whole)  # rank::world of each batch
