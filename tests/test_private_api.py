"""Every private name of Optuna, Ray, MLflow and Python the package relies on, in one list
that an upgrade is checked against: a name that disappears fails here, by name, not as an
``AttributeError`` deep in a run. The last test reads the package's source and fails when
it starts to use a private name that the list lacks."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from pathlib import Path

import optuna
import pytest

REPO = Path(__file__).resolve().parents[1]

MODULE_NAMES = {
    # private import or attribute: where the package uses it (what for)
    "optuna.storages._rdb.models.BaseModel": "record/sqlite_file.py (the schema, made whole)",
    "optuna.storages._rdb.models.StudyModel": "record/bulk.py, lease.py (bulk reads, lease)",
    "optuna.storages._rdb.models.StudyUserAttributeModel": "record/lease.py",
    "optuna.storages._rdb.models.TrialModel": "record/bulk.py, batch.py",
    "optuna.storages._rdb.models.TrialParamModel": "record/bulk.py, batch.py",
    "optuna.storages._rdb.models.TrialValueModel": "record/bulk.py",
    "optuna.storages._rdb.models.TrialIntermediateValueModel": "record/bulk.py",
    "optuna.storages._rdb.models.TrialUserAttributeModel": "record/bulk.py",
    "optuna.storages._rdb.models.TrialSystemAttributeModel": "record/bulk.py",
    "optuna.study._frozen.FrozenStudy": "record/writeback.py (get_all_studies' type)",
    "optuna.samplers.TPESampler._compute_acquisition_func": "record/sampling/distinct.py",
    "optuna.study.Study._get_trials": "record/sampling/history.py (TPE's bounded view)",
    "ray._common.utils.get_default_ray_temp_dir": "compute/cluster.py (its session folder)",
    "ray._private.worker._global_node": "compute/cluster.py (the local Ray's processes)",
    "ray._raylet.Config": "compute/cluster.py (Ray's config before a driver connects)",
    "ray._raylet.GcsClient": "tuning/preflight.py (is the cluster at --address up)",
    "ray.air._internal.usage.tag_callbacks": "compute/cluster.py (no usage tagging)",
    "ray.tune.execution.class_cache._ActorClassCache.get": "tuning/actors.py (workers' env)",
    "mlflow.utils.validation._validate_model_name": "handover/registry.py (one-line refusal)",
    "mlflow.utils.validation._validate_alias_name": "handover/registry.py (ALIAS_CHECK)",
    "mlflow.utils.validation._validate_alias_name_reserved": "handover/registry.py",
    "concurrent.futures.thread._python_exit": "cli.py (an exit that waits for no pool)",
    "atexit._run_exitfuncs": "cli.py (the exit hooks, then os._exit)",
}
"""Importable names: a module path, then attributes."""

RENAMED = {
    "mlflow.utils.validation._validate_alias_name": "_validate_model_alias_name",
    "mlflow.utils.validation._validate_alias_name_reserved": "_validate_model_alias_name_reserved",
}
"""Names of :data:`MODULE_NAMES` the package also finds under their older name (before
MLflow 3.18): either one being there is enough."""

LOGGERS = ("ray._private.authentication.authentication_token_setup", "ray._private.worker")
"""Ray's modules whose loggers the package filters (compute/cluster.py): they must exist."""

INSTANCE_NAMES = {
    "_storage": "Study: the storage a study reads (report, bridge, writer, ...)",
    "_study_id": "Study: its id in that storage",
    "_thread_local": "Study: Optuna's per-thread trial cache (bridge.py, history.py)",
    "_trial_id": "FrozenTrial: its id in the storage (record/, report/, bridge.py)",
    "_backend": "_CachedStorage: the RDB storage under Optuna's cache (record/storage.py)",
    "_trial_id_to_study_id_and_number": "_CachedStorage: numbers of new trials (writeback)",
    "_rng": "TPESampler: its random state (distinct.py's Thompson pick)",
    "_initializing": "ModuleSpec: a module still importing (compute/seeds.py)",
}
"""Private attributes of objects, checked on real ones below."""


def _resolve(dotted: str) -> object:
    """The object ``dotted`` names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


@pytest.mark.parametrize("dotted", sorted(MODULE_NAMES))
def test_each_private_name_the_package_imports_is_there(dotted: str) -> None:
    if dotted.startswith("mlflow"):
        pytest.importorskip("mlflow")
    older = [f"{dotted.rsplit('.', 1)[0]}.{RENAMED[dotted]}"] if dotted in RENAMED else []
    errors: list[Exception] = []
    for name in [dotted, *older]:
        try:
            _resolve(name)  # a value may be None (``_global_node`` before Ray starts)
            return
        except (ImportError, AttributeError) as exc:
            errors.append(exc)
    gone = " nor ".join([dotted, *older])
    raise AssertionError(f"{gone} is gone ({errors[0]}): used in {MODULE_NAMES[dotted]}")


@pytest.mark.parametrize("name", LOGGERS)
def test_each_logger_the_package_filters_is_a_module(name: str) -> None:
    assert importlib.util.find_spec(name) is not None


def test_each_private_attribute_is_on_the_objects_that_carry_it(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/optuna.db")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    sampler = optuna.samplers.TPESampler(seed=0)
    carriers = {
        "_storage": study,
        "_study_id": study,
        "_thread_local": study,
        "_trial_id": study.trials[0],
        "_backend": study._storage,
        "_trial_id_to_study_id_and_number": study._storage,
        "_rng": sampler,
        "_initializing": importlib.util.find_spec("json"),
    }
    assert set(carriers) == set(INSTANCE_NAMES)
    missing = [name for name, obj in carriers.items() if not hasattr(obj, name)]
    assert not missing, [f"{n}: {INSTANCE_NAMES[n]}" for n in missing]
    assert hasattr(sampler._rng, "rng")  # distinct.py draws from sampler._rng.rng
    assert {"deepcopy", "states", "use_cache"} <= set(
        inspect.signature(optuna.Study._get_trials).parameters
    )


def _private_uses() -> set[str]:
    """The private names the package's source uses and defines nowhere itself: private
    imports of Optuna, Ray and MLflow (dotted), and ``x._name`` attributes (bare)."""
    trees = [ast.parse(p.read_text()) for p in sorted((REPO / "search").rglob("*.py"))]
    ours: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                ours.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                ours.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                ours.add(node.id)
    found: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    dotted = f"{node.module}.{alias.name}"
                    top = dotted.split(".")[0]
                    if top in ("optuna", "ray", "mlflow") and "._" in f".{dotted}":
                        found.add(dotted)
            named = None
            if isinstance(node, ast.Attribute):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    named = node.attr
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "getattr"
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
            ):
                named = str(node.args[1].value)
            if named and named.startswith("_") and not named.startswith("__") and named not in ours:
                found.add(named)
    return found


def test_the_list_names_every_private_name_the_source_uses() -> None:
    """A private name newly used (imported, or read as an attribute) without its line in
    the lists above fails here: add it, so that an upgrade is checked against it."""
    listed = set(INSTANCE_NAMES) | {d.rsplit(".", 1)[-1] for d in MODULE_NAMES}
    modules = {d.rsplit(".", 1)[0] for d in MODULE_NAMES} | set(MODULE_NAMES)
    unlisted = sorted(
        name
        for name in _private_uses()
        if name not in listed and name not in modules and not name.startswith("search.")
    )
    assert not unlisted, unlisted
