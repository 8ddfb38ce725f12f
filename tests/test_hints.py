"""Messages that name the fix: "did you mean" for a misspelled trainable, loader or key, a
knob written at the top level, and an export hook declared as the public API teaches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from search.compute.data import load_data
from search.contract import UnknownTrainableError, declarations
from search.errors import SearchError
from search.handover.train import no_hook
from search.specs.schema import DataSpec, parse_spec
from tests.helpers import base_spec


def _error(tmp_path: Path, **changes: Any) -> str:
    with pytest.raises(SearchError) as raised:
        parse_spec(base_spec(tmp_path, **changes), "s.yaml")
    return str(raised.value)


@pytest.mark.parametrize(
    ("trainable", "meant"),
    [
        ("search.testng:curve", "trainable module 'search.testng' cannot be imported "
         "(did you mean 'search.testing'?)"),
        ("serch.testing:curve", "(did you mean 'search.testing'?)"),
        ("torch_cnnn", "(did you mean 'torch_cnn'?)"),
    ],
)  # fmt: skip
def test_a_misspelled_trainable_module_is_named_with_the_right_one(
    tmp_path: Path, trainable: str, meant: str
) -> None:
    line = _error(tmp_path, trainable=trainable)
    assert line.startswith("s.yaml: trainable: ") and meant in line, line


def test_a_misspelled_function_or_loader_is_named_with_the_right_one() -> None:
    with pytest.raises(
        UnknownTrainableError, match=r"no function 'cruve' \(did you mean 'curve'\?\)$"
    ):
        declarations("search.testing:cruve")
    loader = DataSpec(loader="search.testing.keras_trainables:blob")
    with pytest.raises(SearchError, match=r"no function 'blob' \(did you mean 'blobs'\?\)$"):
        load_data(loader)


def test_a_knob_at_the_top_level_is_sent_under_space_or_fixed(tmp_path: Path) -> None:
    searched = _error(tmp_path, hidden={"choice": [32, 64]})
    assert searched == (
        "s.yaml: hidden: unknown key; a knob to search goes under space: "
        "(space: {hidden: {choice: ...}})"
    )
    fixed = _error(tmp_path, hidden=64)
    assert fixed.startswith(
        "s.yaml: hidden: unknown key; a knob of the trainable goes under fixed:"
    )
    typo = _error(tmp_path, budjet={"trials": 3})
    assert typo == "s.yaml: budjet: unknown key (did you mean 'budget'?)"
    nested = _error(tmp_path, space={"x": {"unifrom": [0, 1]}})
    assert nested == "s.yaml: space.x.unifrom: unknown key (did you mean 'uniform'?)"


def test_a_trainable_without_an_export_hook_is_told_the_public_decorator() -> None:
    line = no_hook("proj.models:fit")
    assert "@fit.exporter" in line and "def export(config, data, ctx, out_dir)" in line
    assert "search/" not in line and "registry" not in line
