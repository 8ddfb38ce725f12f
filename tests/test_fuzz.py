"""Bad input at volume: random specs and argument lists never escape as anything but one line.

``parse_spec`` either returns a valid :class:`StudySpec` or raises :class:`SpecError` whose
message is one line starting with the source name; the CLI exits 0, 1 or 2, never with an
unhandled exception. No run starts: every spec the CLI sees fails validation.
"""

from __future__ import annotations

import contextlib
import copy
import math
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from search.cli import app
from search.errors import SpecError
from search.specs.schema import StudySpec, load_spec, parse_spec

pytestmark = pytest.mark.slow  # over 5 s here: make test-fast leaves it out

SOURCE = "fuzz.yaml"
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VALID: dict[str, Any] = {
    "study": "fuzz",
    "trainable": "search.testing:curve",
    "data": {"name": "digits", "val_fraction": 0.2, "split_seed": 0},
    "objective": {"metric": "val_accuracy", "mode": "max"},
    "budget": {"trials": 4, "max_epochs": 3, "time_limit_s": 60},
    "asha": {"enabled": True, "grace_period": 1, "reduction_factor": 3},
    "sampler": {"name": "tpe", "seed": 0},
    "resources": {"cpus_per_trial": 1, "gpus_per_trial": 0, "max_concurrent": 2},
    "faults": {"max_failures": 1, "checkpoints": True},
    "storage": "sqlite:///results/optuna.db",
    "fixed": {"channels": 16},
    "space": {
        "lr": {"loguniform": [1.0e-4, 1.0e-1]},
        "batch_size": {"choice": [32, 64]},
        "layers": {"int": [1, 4], "step": 1},
        "dropout": {"uniform": [0.0, 0.5]},
        "optimizer": {"choice": ["sgd", "adam"]},
        "momentum": {"uniform": [0.8, 0.99], "when": {"optimizer": "sgd"}},
        "tag": {"fixed": "baseline"},
    },
}

keys = st.text(max_size=12) | st.sampled_from(
    ["study", "space", "uniform", "loguniform", "int", "choice", "when", "fixed", "step", "log"]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["tpe", "grid", "max", "min", "sgd", "search.testing:curve", "x:y", ""])
)
junk = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=15,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (dict keys and list indexes) into ``node``, the root excluded."""
    out: list[tuple[Any, ...]] = []
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else []
    )
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


def _parent(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        data = data[key]
    return data


@st.composite
def mutated_specs(draw: st.DrawFn) -> dict[str, Any]:
    """The valid spec after one to four random edits: wrong types, deletions, unknown keys,
    swapped or degenerate bounds."""
    data = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(data)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _parent(data, path), path[-1]
        kind = draw(st.sampled_from(["replace", "delete", "unknown", "bounds", "number"]))
        if kind == "replace":
            parent[key] = draw(junk)
        elif kind == "delete":
            del parent[key]
        elif kind == "unknown" and isinstance(parent, dict):
            parent[draw(keys)] = draw(junk)
        elif kind == "bounds" and isinstance(parent[key], list) and parent[key]:
            parent[key] = draw(
                st.sampled_from(
                    [parent[key][::-1], parent[key][:1], [], parent[key] * 2, [0, 0], [-1, 1]]
                )
            )
        elif isinstance(parent[key], int | float) and not isinstance(parent[key], bool):
            parent[key] = draw(st.sampled_from([0, -1, 0.5, 10**9, -math.inf, math.nan, "3"]))
    return data


def _check(data: Any) -> None:
    try:
        spec = parse_spec(data, SOURCE)
    except SpecError as exc:
        text = str(exc)
        assert "\n" not in text and "\r" not in text, repr(text)
        assert text.startswith(f"{SOURCE}: "), text
    else:
        assert isinstance(spec, StudySpec)
        assert parse_spec(spec.to_dict(), SOURCE) == spec  # a valid spec round-trips


@FAST
@given(junk)
def test_random_data_is_a_spec_or_one_line(data: Any) -> None:
    _check(data)


@FAST
@given(st.dictionaries(st.sampled_from(sorted(VALID)) | keys, junk, max_size=8))
def test_random_top_level_mappings(data: dict[str, Any]) -> None:
    _check(data)


@settings(max_examples=300, deadline=None)
@given(mutated_specs())
@example({**VALID, "sampler": {"name": "tpe", "seed": None}})  # was read back as seed 0
@example({**VALID, "fixed": {"a": math.inf}})  # was stored as null
@example({**VALID, "bad\nkey": 1})  # was a two-line error
def test_mutated_valid_specs(data: dict[str, Any]) -> None:
    _check(data)


EDGE_FILES = [
    b"[" * 3000 + b"]" * 3000,  # deeper than Python's recursion limit
    b"study: " + b"9" * 5000,  # an integer Python refuses to parse
    b"\xff\xfe\x00a",  # not UTF-8
    b"\x00\x01",
    b"a: &x [1, 2]\nb: *x\n",
    b"!!python/object/apply:os.system [echo pwned]",  # safe_load refuses the tag
    b"study: .nan\nfixed: {a: .inf}\n",
]


def _load(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        path.write_bytes(content)
        try:
            load_spec(path)
        except SpecError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(f"{path}: "), str(exc)


@FAST
@given(
    st.binary(max_size=100)
    | st.text(max_size=200).map(str.encode)
    | junk.map(lambda d: yaml.safe_dump(d, default_flow_style=True).encode())
)
def test_random_yaml_files(content: bytes) -> None:
    _load(content)


def test_yaml_edge_cases() -> None:
    for content in EDGE_FILES:
        _load(content)


def test_the_valid_spec_is_valid() -> None:
    assert parse_spec(VALID, SOURCE).study == "fuzz"


SPEC_FILES = {
    "bad.yaml": yaml.safe_dump({**VALID, "bogus": 1}),
    "broken.yaml": "study: [unclosed\n",
    "empty.yaml": "",
    "list.yaml": "- 1\n- 2\n",
}
OPTIONS = [
    "--trials",
    "--max-epochs",
    "--study",
    "--storage",
    "--results",
    "--seed",
    "--address",
    "--verbose",
    "--restart",
    "--help",
    "--bogus",
    "-x",
    "--",
    "=",
]
values = (
    st.sampled_from(["0", "-1", "3", "1e3", "nan", "", "abc", "postgresql://u:p@127.0.0.1:1/x"])
    | st.integers().map(str)
    | st.text(st.characters(blacklist_characters="/\\\x00", codec="utf-8"), max_size=10)
)
arguments = st.lists(st.sampled_from(OPTIONS) | values, max_size=8)
spec_names = st.sampled_from([*SPEC_FILES, "missing.yaml", "."]) | st.text(
    st.characters(blacklist_characters="/\\\x00", codec="utf-8"), min_size=1, max_size=10
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_names, arguments, st.booleans())
def test_random_cli_arguments_never_crash(spec: str, args: list[str], spec_first: bool) -> None:
    argv = ["run", spec, *args] if spec_first else ["run", *args, spec]
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        for name, text in SPEC_FILES.items():
            Path(name).write_text(text)
        with mock.patch(
            "search.tuning.runner.run_study", side_effect=AssertionError("a run started")
        ):
            result = CliRunner().invoke(app, argv)
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            argv,
            repr(result.exception),
        )
        assert result.exit_code in (0, 1, 2), (argv, result.exit_code, result.output)
        assert sorted(p.name for p in Path(tmp).iterdir()) == sorted(SPEC_FILES)  # no results
        if result.exit_code == 2 and result.output.startswith("error: "):
            assert len(result.output.strip().splitlines()) == 1, result.output
