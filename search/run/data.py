"""Loads the dataset a spec names, once, in the driver."""

from __future__ import annotations

from typing import TYPE_CHECKING

from search.contract.dataset import Dataset, image_folder, load_digits

if TYPE_CHECKING:
    from search.spec.schema import DataSpec


def load_data(spec: DataSpec) -> Dataset:
    """Loads the dataset that a validated :class:`~search.spec.schema.DataSpec` names."""
    if spec.name == "image_folder":
        return image_folder(spec.path or "", spec.image_size)
    return load_digits(spec.val_fraction, spec.split_seed)
