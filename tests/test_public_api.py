"""The public API: ``search.__all__``, :mod:`search.keras`, :mod:`search.lightning` and
:mod:`search.hf`, pinned
name by name.

A user's trainable imports only these (README, "Public API"); every other module may move. A
change here breaks users' code: change this file only on purpose. The built-in trainables and
the examples are held to the same surface, read from their source with :mod:`ast`.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import search
import search.hf
import search.keras
import search.lightning
import search.pytorch

REPO = Path(__file__).resolve().parents[1]

SIGNATURES = {
    "trainable": "(fn: 'TrainFn | None' = None, /, *, defaults: 'Mapping[str, Any] | None' = "
    "None, data_parallel: 'ParallelFlag' = None, export: 'ExportFn | None' = None) "
    "-> 'DeclaredTrainable | Callable[[TrainFn], DeclaredTrainable]'",
    "train_to_end": "(train: 'TrainFn', config: 'Mapping[str, Any]', data: 'Dataset', "
    "ctx: 'TrialContext') -> 'Trained'",
    "write_inputs": "(out_dir: 'str | os.PathLike[str]', inputs: 'Any', outputs: 'Any' = None, "
    "*, model: 'str' = 'model.onnx', validation: 'Any' = None, "
    "validation_accuracy: 'float | None' = None, classes: 'Sequence[Any] | None' = None, "
    "mean: 'Any' = None, std: 'Any' = None) -> 'Path'",
    "run": "(spec: 'SpecLike', *, trainable: 'Callable[..., Any] | str | None' = None, "
    "data: 'Any' = None, trials: 'int | None' = None, max_epochs: 'int | None' = None, "
    "study: 'str | None' = None, storage: 'str | None' = None, seed: 'int | None' = None, "
    "results: 'Path | str' = 'results', address: 'str | None' = None, "
    "restart: 'bool' = False) -> 'SearchResult'",
    "load": "(study: 'str', storage: 'str' = 'sqlite:///results/optuna.db', *, "
    "results: 'Path | str' = 'results', trainable: 'Callable[..., Any] | None' = None) "
    "-> 'SearchResult'",
    "materialize": "(data: 'Dataset', path: 'str | None' = None) -> 'Dataset'",
    "load_digits": "(val_fraction: 'float', seed: 'int') -> 'Dataset'",
    "load_shapes": "(val_fraction: 'float', seed: 'int', samples: 'int | None' = None, "
    "difficulty: 'float | None' = None, image_size: 'int | None' = None) -> 'Dataset'",
}
"""Every public function, as ``inspect.signature`` prints it."""
TYPES = {"Metrics", "TrainFn", "ExportFn"}
"""Type aliases: pinned by name (their shape is in ``search.contract.context``)."""
CLASSES = {"TrialContext", "Dataset", "ConfigError", "SearchError", "SpecError", "SearchResult"}
KERAS = {
    "set_threads": "(ctx: 'TrialContext') -> 'bool'",
    "fit": "(model: 'Any', ctx: 'TrialContext', *args: 'Any', callbacks: 'Sequence[Any]' = (), "
    "**fit_kwargs: 'Any') -> 'Generator[Metrics, None, Any]'",
    "save_model": "(model: 'Any', out_dir: 'str | Path') -> 'Path'",
    "save_onnx": "(model: 'Any', out_dir: 'str | Path', x: 'Any' = None, labels: 'Any' = None, "
    "**declare: 'Any') -> 'Metrics'",
    "train_and_save": "(train: 'TrainFn', config: 'Mapping[str, Any]', data: 'Dataset', "
    "ctx: 'TrialContext', out_dir: 'Path', **declare: 'Any') -> 'Metrics'",
}
""":mod:`search.keras`, the public module for Keras users."""
HF = {
    "training_args": "(config: 'Mapping[str, Any]', ctx: 'TrialContext', **overrides: 'Any') "
    "-> 'Any'",
    "train": "(trainer: 'Any', ctx: 'TrialContext') -> 'Generator[Metrics, None, Any]'",
}
""":mod:`search.hf`, the public module for Hugging Face Trainer users."""
LIGHTNING = {
    "fit": "(module: 'Any', ctx: 'TrialContext', *, datamodule: 'Any' = None, "
    "train_dataloaders: 'Any' = None, val_dataloaders: 'Any' = None, "
    "trainer_kwargs: 'Mapping[str, Any] | None' = None) -> 'Generator[Metrics, None, Any]'",
}
""":mod:`search.lightning`, the public module for Lightning users."""
PYTORCH = {
    "sequential": "(build: 'Callable[[Mapping[str, Any], Any], Any]', *, "
    "defaults: 'Mapping[str, Any] | None' = None) -> 'Any'",
    "standardize": "(tensors: 'Any') -> 'Any'",
}
""":mod:`search.pytorch`, the public module for a user's ``nn.Sequential`` (fusable)."""
PUBLIC_MODULES = {"search", "search.keras", "search.lightning", "search.hf", "search.pytorch"}
TRIAL_CONTEXT = [
    ("max_epochs", "int", dataclasses.MISSING),
    ("seed", "int", 0),
    ("num_threads", "int", 1),
    ("device", "str", "cpu"),
    ("trial_number", "int", 0),
    ("trial_dir", "str", "."),
    ("extras", "Mapping[str, Any]", dataclasses.MISSING),  # a factory: {}
    ("checkpoint_dir", "str | None", None),
    ("restore_dir", "str | None", None),
    ("start_epoch", "int", 1),
    ("gpu_share", "float | None", None),
    ("gpu_memory_fraction", "float | None", None),
    ("data_path", "str | None", None),
    ("replicas", "int", 1),
    ("rank", "int", 0),
    ("world_size", "int", 1),
    ("gpu_total_bytes", "int | None", None),
    ("max_steps", "int | None", None),
    ("profile", "bool", False),
    ("history", "list[Metrics] | None", None),
]
DATASET = [
    ("x_train", "np.ndarray"),
    ("y_train", "np.ndarray"),
    ("x_val", "np.ndarray"),
    ("y_val", "np.ndarray"),
    ("num_classes", "int"),
    ("name", "str"),
    ("path", "str | None"),
    ("image_size", "int | None"),
    ("val_fraction", "float"),
    ("split_seed", "int"),
]
TRAINED = [("model", "Any"), ("metrics", "Metrics"), ("epochs", "int")]
"""What :func:`search.train_to_end` returns (its class is not public, its fields are)."""


def test_the_public_names_are_exactly_these() -> None:
    expected = {"__version__", *SIGNATURES, *TYPES, *CLASSES}
    assert sorted(search.__all__) == sorted(expected)
    for name in search.__all__:
        assert hasattr(search, name), name


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_a_public_function_keeps_its_signature(name: str) -> None:
    assert str(inspect.signature(getattr(search, name))) == SIGNATURES[name]


@pytest.mark.parametrize("name", sorted(KERAS))
def test_a_keras_function_keeps_its_signature(name: str) -> None:
    assert str(inspect.signature(getattr(search.keras, name))) == KERAS[name]


@pytest.mark.parametrize("name", sorted(HF))
def test_a_hugging_face_function_keeps_its_signature(name: str) -> None:
    assert str(inspect.signature(getattr(search.hf, name))) == HF[name]


@pytest.mark.parametrize("name", sorted(LIGHTNING))
def test_a_lightning_function_keeps_its_signature(name: str) -> None:
    assert str(inspect.signature(getattr(search.lightning, name))) == LIGHTNING[name]


@pytest.mark.parametrize("name", sorted(PYTORCH))
def test_a_pytorch_function_keeps_its_signature(name: str) -> None:
    assert str(inspect.signature(getattr(search.pytorch, name))) == PYTORCH[name]


def test_trial_context_keeps_its_fields_types_and_defaults() -> None:
    fields = dataclasses.fields(search.TrialContext)
    assert [(f.name, str(f.type), f.default) for f in fields] == TRIAL_CONTEXT
    assert search.TrialContext(max_epochs=1).extras == {}
    assert search.TrialContext.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_dataset_and_trained_keep_their_fields() -> None:
    assert [(f.name, str(f.type)) for f in dataclasses.fields(search.Dataset)] == DATASET
    trained = search.train_to_end.__annotations__["return"]
    assert trained == "Trained"
    from search.contract.driver import Trained

    assert [(f.name, str(f.type)) for f in dataclasses.fields(Trained)] == TRAINED


def test_the_types_and_the_error_are_what_users_expect() -> None:
    assert search.Metrics == dict[str, float]
    assert issubclass(search.ConfigError, ValueError)
    declared = search.trainable(defaults={"lr": 0.1})(lambda config, data, ctx: iter(()))
    assert callable(declared.exporter)


def test_importing_search_loads_no_heavy_library() -> None:
    """``import search`` stays cheap: no Ray, Optuna, PyTorch, TensorFlow or Keras."""
    heavy = "ray", "optuna", "torch", "tensorflow", "keras", "sklearn"
    code = (
        "import sys, search; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(heavy)!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"


def test_the_adapters_are_reached_from_import_search_alone() -> None:
    """``import search`` then ``search.lightning.fit``, as the README writes it: the adapter is
    imported when first named, not by ``import search``."""
    code = (
        "import sys, search; before = 'search.lightning' in sys.modules; "
        "print(before, search.lightning.fit.__module__, search.keras.fit.__module__, "
        "search.hf.train.__module__, search.pytorch.sequential.__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.split() == [
        "False",
        "search.lightning",
        "search.keras",
        "search.hf",
        "search.pytorch",
    ]


def search_imports(path: Path) -> list[str]:
    """Every import of a ``search`` module or name in ``path`` (any level): ``"search.X"``
    for ``from search import X``, the module for ``import search.m`` or ``from search.m``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "search"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "search":
                found += [f"search.{a.name}" for a in node.names]
            elif node.module.split(".")[0] == "search":
                found += [f"{node.module}:{a.name}" for a in node.names]
    return found


def private_imports(path: Path) -> list[str]:
    """The imports in ``path`` that reach past the public surface."""
    public = {f"search.{n}" for n in search.__all__} | PUBLIC_MODULES
    public |= {f"search.keras:{n}" for n in KERAS}
    public |= {f"search.hf:{n}" for n in HF}
    public |= {f"search.lightning:{n}" for n in LIGHTNING}
    public |= {f"search.pytorch:{n}" for n in PYTORCH}
    return [name for name in search_imports(path) if name not in public]


@pytest.mark.parametrize("folder", ["trainables", "examples"])
def test_built_ins_and_examples_import_only_public_names(folder: str) -> None:
    files = sorted((REPO / folder).rglob("*.py"))
    assert files
    private = {str(p.relative_to(REPO)): found for p in files if (found := private_imports(p))}
    assert private == {}


def test_the_import_check_catches_a_private_import(tmp_path: Path) -> None:
    source = tmp_path / "user.py"
    source.write_text(
        "import search.keras\n"
        "from search import TrialContext, trainable\n"
        "from search.contract import Metrics\n"
        "from search import drive\n"
        "def f():\n"
        "    from search.contract.dataset import subsample\n"
    )
    assert private_imports(source) == [
        "search.contract:Metrics",
        "search.drive",
        "search.contract.dataset:subsample",
    ]
