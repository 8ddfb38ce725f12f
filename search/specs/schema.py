"""The study spec: one YAML file, validated once, at the boundary.

Example:
    >>> spec = StudySpec.model_validate({
    ...     "study": "demo", "trainable": "torch_cnn",
    ...     "objective": {"metric": "val_accuracy", "mode": "max"},
    ...     "space": {"lr": {"loguniform": [1e-4, 1e-1]}},
    ... })
    >>> spec.budget.trials
    32
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from search.contract import BUILTIN, UnknownTrainableError, check_trainable
from search.errors import SpecError, did_you_mean
from search.specs.pinned import PINNED
from search.specs.space import Param, check_config, check_space, grid

DEFAULT_STORAGE = "sqlite:///results/optuna.db"
_FIELD_PREFIX = re.compile(r"^[A-Za-z_][\w.]*: ")
_UNION_BRANCH = re.compile(r"^([A-Z]\w*|list\[\w+\])$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataSpec(_Strict):
    """Which data to train on and how to split it.

    ``digits`` is scikit-learn's 8x8 handwritten digits (shipped offline). ``shapes`` is 10
    classes of shapes in RGB images generated in code (32x32 unless ``image_size``; ``samples``
    images, default 12,000; ``difficulty`` in [0, 1], default 0.5). ``image_folder``
    is a folder with one subfolder of images per class, read inside each trial, so ``path``
    must exist on every node that runs trials. ``loader: package.module:function`` names a
    function of yours that the driver calls once, with ``args`` as keyword arguments; whatever
    it returns (arrays, a DataFrame, a dict of tensors: anything picklable) reaches every trial
    as its ``data``, through Ray's object store. ``val_fraction`` and ``split_seed`` are for the
    built-in datasets; a loader splits its data itself. ``none`` hands trials ``None``: what a
    trainable of yours that loads its own data gets when its spec has no ``data:`` (a built-in
    trainable's default is ``digits``).
    """

    name: Literal["digits", "shapes", "image_folder", "none"] = "digits"
    path: str | None = None
    image_size: int | None = Field(None, ge=8, le=1024)
    samples: int | None = Field(None, ge=10, le=10_000_000)
    difficulty: float | None = Field(None, ge=0.0, le=1.0)
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    split_seed: int = 0
    loader: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    args: dict[str, Any] = Field(default_factory=dict)

    @property
    def label(self) -> str:
        """What the data is, for people: the loader's name, or the built-in dataset's."""
        return self.loader or self.name

    @model_validator(mode="after")
    def _path_when_needed(self) -> DataSpec:
        if self.loader is not None:
            given = sorted(self.model_fields_set & {"name", "path", "image_size"})
            if given:
                raise ValueError(
                    f"data.{given[0]}: a loader loads its own data; remove "
                    f"{given[0]} (pass what the loader needs in args)"
                )
            return self
        if self.args:
            raise ValueError("data.args: args are for a loader; name one with loader")
        if self.name == "image_folder" and not self.path:
            raise ValueError("data.path: image_folder needs the folder's path")
        if self.name != "image_folder" and self.path:
            raise ValueError(f"data.path: {self.name} reads no folder; remove path")
        generated = sorted(self.model_fields_set & {"samples", "difficulty"})
        if generated and self.name != "shapes":
            raise ValueError(
                f"data.{generated[0]}: only the generated shapes dataset takes it "
                f"(name: shapes), not {self.name}"
            )
        return self


class ObjectiveSpec(_Strict):
    """A metric that the trainable reports and the search optimizes."""

    metric: str = Field(min_length=1)
    mode: Literal["min", "max"]


MAX_OBJECTIVES = 4
"""The most objectives a study may have (non-dominated sorting loses its edge beyond)."""


class BudgetSpec(_Strict):
    """How much the study may spend."""

    trials: int = Field(32, ge=1)
    max_epochs: int = Field(27, ge=1)
    time_limit_s: float | None = Field(None, gt=0)
    gpu_hours: float | None = Field(None, gt=0)
    cpu_hours: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_device_budget(self) -> BudgetSpec:
        if self.gpu_hours is not None and self.cpu_hours is not None:
            raise ValueError("budget.cpu_hours: give gpu_hours or cpu_hours, not both")
        return self


class AshaSpec(_Strict):
    """Asynchronous successive halving across the whole study."""

    enabled: bool = True
    grace_period: int = Field(1, ge=1)
    reduction_factor: float = Field(3, ge=2)
    brackets: int = Field(1, ge=1, le=5)
    """Hyperband brackets (Ray's ``AsyncHyperBandScheduler(brackets=...)``): bracket ``s``
    starts its trials at ``grace_period * reduction_factor**s`` epochs, for tasks whose early
    epochs mislead. 1 is plain ASHA."""
    recheck: bool = False
    """Hold a trial to its last rung at every epoch, not only when it arrives there: one whose
    value at that rung later arrivals push below the rung's cutoff stops at its next epoch
    (:class:`search.tuning.scheduler.PruneReportingASHA`)."""


class SamplerSpec(_Strict):
    """Optuna's sampler: how the next config is proposed."""

    name: Literal["auto", "tpe", "random", "cmaes", "grid"] = "auto"
    seed: int | None = 0
    args: dict[str, Any] = {}
    """Arguments of the sampler that override the ones the project pins
    (:data:`search.record.sampling.samplers.PINNED`), e.g. ``{n_startup_trials: 16}`` for TPE."""
    start_from: list[dict[str, Any]] = []
    """Configs the user already trusts (their current defaults), run first, in order, before
    the sampler proposes anything (Optuna's ``enqueue_trial``). Each names values of the
    space's parameters; a parameter it leaves out is sampled."""

    @model_validator(mode="after")
    def _known_args(self) -> SamplerSpec:
        known = PINNED.get(self.name, {})
        for key, value in self.args.items():
            if key not in known:
                names = ", ".join(sorted(known)) or "none"
                raise ValueError(
                    f"sampler.args.{key}: not an argument the {self.name} sampler takes "
                    f"(it takes: {names})"
                )
            if not isinstance(value, type(known[key])) or isinstance(value, bool) != isinstance(
                known[key], bool
            ):
                raise ValueError(
                    f"sampler.args.{key}: expected a {type(known[key]).__name__}, got {value!r}"
                )
        return self


class WarmStartSpec(_Strict):
    """An earlier study whose COMPLETE trials the sampler learns from before its first ask."""

    study: str = Field(min_length=1)
    storage: str | None = None
    """Where that study lives; the spec's own ``storage`` when left out."""


class ResourcesSpec(_Strict):
    """What each trial gets, and how many run at once (see :mod:`search.compute.placement`).

    ``cpus_per_trial``: unset means 1, or under ``gpus_per_trial: auto`` the machine's cores
    shared among the trials that run at once. ``gpus_per_trial``: a fraction packs trials onto
    one GPU, 1 or more (whole numbers) gives each trial whole GPUs, ``auto`` measures the
    largest config and packs as many trials per GPU as fit (CPUs only when there is no GPU).
    ``workers_per_trial``: devices that train one trial data-parallel (DDP processes for
    PyTorch, ``MirroredStrategy`` replicas for TensorFlow); defaults to ``gpus_per_trial`` when
    that is 2 or more; on CPUs it forces gloo processes, or logical CPU devices for TF.
    ``memory_headroom``: share added to the measured peak memory when ``auto`` packs.
    ``fuse``: ``auto`` (the default), ``off`` or N, the most trials of one shape that train
    together as one model on one device (:mod:`search.tuning.fusion`); ``auto`` fuses where a
    short measurement on the run's GPU shows it pays (:mod:`search.tuning.fusion_auto`).
    """

    cpus_per_trial: float | None = Field(None, gt=0)
    gpus_per_trial: float | Literal["auto"] = 0.0
    max_concurrent: int | None = Field(None, ge=1)
    workers_per_trial: int | None = Field(None, ge=1, le=64)
    memory_headroom: float = Field(0.25, ge=0.0, le=4.0)
    fuse: int | Literal["auto"] | None = "auto"

    @field_validator("fuse", mode="before")
    @classmethod
    def _fuse(cls, value: Any) -> Any:
        if value == "off" or value is False:
            return None
        if value is None or value == "auto":
            return "auto" if value == "auto" else None
        if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= 256:
            raise ValueError(
                f"expected auto, off or a whole number of trials from 2 to 256, got {value!r}"
            )
        return value

    @field_validator("gpus_per_trial", mode="before")
    @classmethod
    def _gpus(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number >= 0 or 'auto', got {value!r}")
        if value < 0 or (value > 1 and value != int(value)):
            raise ValueError(
                f"expected a fraction up to 1, a whole number of GPUs, or 'auto', got {value!r}"
            )
        return float(value)

    @field_validator("workers_per_trial")
    @classmethod
    def _workers_fit(cls, workers: int | None, info: ValidationInfo) -> int | None:
        gpus = info.data.get("gpus_per_trial", 0.0)
        if workers is None or workers == 1 or gpus is None:
            return workers
        if gpus == "auto" or 0 < gpus < 1:
            raise ValueError(
                f"several workers need whole GPUs (or none), not gpus_per_trial {gpus}"
            )
        if gpus >= 1 and workers != int(gpus):
            raise ValueError(
                f"each worker trains on one of the trial's {int(gpus)} GPUs; set {int(gpus)} or "
                f"leave it out, got {workers}"
            )
        return workers


class FaultsSpec(_Strict):
    """What happens when a trial raises (retried from its last checkpoint, then FAIL) or hangs.

    ``stall_s``: seconds without an epoch after which the driver stops a trial as hung (FAIL,
    not retried). Unset or ``auto``: :func:`search.tuning.stall.stall_limit` (a multiple of the
    study's median epoch time, with a floor; no limit until an epoch was timed).
    """

    max_failures: int = Field(2, ge=0)
    checkpoints: bool = True
    checkpoint_every_s: float = Field(30.0, ge=0)
    stall_s: float | None = None

    @field_validator("stall_s", mode="before")
    @classmethod
    def _stall(cls, value: Any) -> Any:
        if value is None or value == "auto":
            return None  # auto: left out of the stored spec, as before the field existed
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"expected a number of seconds > 0 or 'auto', got {value!r}")
        return float(value)


class MlflowExportSpec(_Strict):
    """Where ``export`` registers the winner (:mod:`search.handover.registry`).

    ``tracking_uri``: an MLflow server (``http://host:5000``), ``sqlite:///mlflow.db`` or a
    local folder; ``${VAR}`` reads the environment. ``model_name``: the registered model
    (default: the study's name). ``alias``: set on each new version.
    """

    tracking_uri: str = Field(min_length=1)
    model_name: str | None = Field(None, min_length=1)
    alias: str = Field("challenger", min_length=1)


class ExportSpec(_Strict):
    """What ``export`` does beyond the bundle folder."""

    mlflow: MlflowExportSpec | None = None


TRACKING_SCHEMES = ("http://", "https://", "sqlite:///", "postgresql://", "mysql://", "file:")


class TrackingSpec(_Strict):
    """Where the search itself is tracked (:mod:`search.record.tracking.tracker`).

    ``mlflow``: an MLflow server (``http://host:5000``), ``sqlite:///mlflow.db`` (or another
    database MLflow takes) or a local folder; ``${VAR}`` reads the environment. The study is
    one run of the experiment named after it, each trial a child run.
    """

    mlflow: str = Field(min_length=1)

    @field_validator("mlflow")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if "://" in value and not value.startswith(TRACKING_SCHEMES):
            raise ValueError(
                "expected an http(s):// MLflow server, a sqlite:/// (or postgresql://, "
                f"mysql://) database or a local folder, got {value.split('://')[0]!r}://..."
            )
        return value


class StudySpec(_Strict):
    """A whole study: what to train, on what, how to search and where to record it."""

    study: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    trainable: str
    data: DataSpec = DataSpec()
    objective: ObjectiveSpec | list[ObjectiveSpec]
    budget: BudgetSpec = BudgetSpec()
    asha: AshaSpec = AshaSpec()
    sampler: SamplerSpec = SamplerSpec()
    warm_start: WarmStartSpec | None = None
    resources: ResourcesSpec = ResourcesSpec()
    faults: FaultsSpec = FaultsSpec()
    profile: bool = False
    profile_trial: int = Field(0, ge=0)
    storage: str = DEFAULT_STORAGE
    export: ExportSpec | None = None
    tracking: TrackingSpec | None = None
    fixed: dict[str, Any] = {}
    space: dict[str, Param] = {}

    @model_validator(mode="before")
    @classmethod
    def _own_data(cls, value: Any) -> Any:
        """A trainable of the user's with no ``data:`` loads its own: its trials get ``None``
        (and its card says so), not the digits a built-in trainable defaults to."""
        if isinstance(value, Mapping) and "data" not in value:
            trainable = value.get("trainable")
            if isinstance(trainable, str) and trainable not in BUILTIN:
                return {**value, "data": {"name": "none"}}
        return value

    @field_validator("trainable")
    @classmethod
    def _known_trainable(cls, value: str, info: ValidationInfo) -> str:
        if info.context and not info.context.get("find_code", True):
            return value  # a stored spec read back: its code is not looked up
        try:
            check_trainable(value)
        except UnknownTrainableError as exc:
            raise ValueError(str(exc)) from None
        return value

    @property
    def objectives(self) -> tuple[ObjectiveSpec, ...]:
        """Every objective, the primary one first (one for a single-objective study)."""
        return tuple(self.objective) if isinstance(self.objective, list) else (self.objective,)

    @property
    def primary(self) -> ObjectiveSpec:
        """The first objective: the one a single-metric view (the console's best, the
        confirmation table, Tune's own ``metric``) ranks by."""
        return self.objectives[0]

    @property
    def multi_objective(self) -> bool:
        """Whether the study trades off several objectives (a Pareto front, MO-ASHA)."""
        return len(self.objectives) > 1

    @field_validator("objective")
    @classmethod
    def _objectives(
        cls, value: ObjectiveSpec | list[ObjectiveSpec]
    ) -> ObjectiveSpec | list[ObjectiveSpec]:
        if not isinstance(value, list):
            return value
        if not 1 <= len(value) <= MAX_OBJECTIVES:
            raise ValueError(f"expected 1 to {MAX_OBJECTIVES} objectives, got {len(value)}")
        names = [o.metric for o in value]
        if len(set(names)) < len(names):
            raise ValueError(f"each metric at most once, got {', '.join(names)}")
        return value[0] if len(value) == 1 else value

    @model_validator(mode="after")
    def _consistent(self) -> StudySpec:
        check_space(self.space, self.fixed)
        for index, config in enumerate(self.sampler.start_from):
            try:
                check_config(self.space, config)
            except ValueError as exc:
                raise ValueError(f"sampler.start_from.{index}.{exc}") from None
        if self.multi_objective and self.sampler.name == "cmaes":
            raise ValueError("sampler.name: cmaes optimizes one objective; use tpe, random or grid")
        if self.sampler.name == "grid":
            grid(self.space)
        if self.multi_objective and self.asha.brackets > 1:
            raise ValueError("asha.brackets: MO-ASHA runs one bracket; leave brackets at 1")
        if self.multi_objective and self.asha.recheck:
            raise ValueError("asha.recheck: MO-ASHA checks a trial on arrival only; leave it off")
        if self.asha.grace_period > self.budget.max_epochs:
            raise ValueError(
                f"asha.grace_period: must not exceed budget.max_epochs "
                f"({self.budget.max_epochs}), got {self.asha.grace_period}"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain YAML/JSON-ready data (round-trips through validation)."""
        data = _without_unset(self, self.model_dump(mode="json"))
        if self.data.loader is not None:  # the built-in name does not apply
            for key in ("name", "val_fraction", "split_seed"):
                data["data"].pop(key, None)
        if not self.data.args:
            data["data"].pop("args", None)
        return data


def _without_unset(model: BaseModel, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (``model`` dumped) less each ``None`` that is its field's default; a ``None``
    that differs from its default (``fuse: off``, an unseeded sampler) stays, so the dump
    reads back as the same spec.

    Example:
        >>> spec = parse_spec({"study": "s", "trainable": "torch_cnn",
        ...     "objective": {"metric": "val_loss", "mode": "min"},
        ...     "resources": {"fuse": "off"}, "space": {"lr": {"loguniform": [1e-4, 1e-2]}}})
        >>> spec.to_dict()["resources"]["fuse"] is None, "export" in spec.to_dict()
        (True, False)
        >>> parse_spec(spec.to_dict()).resources.fuse is None
        True
    """
    for name, field in type(model).model_fields.items():
        key, value = field.alias or name, getattr(model, name)
        if value is None and field.default is None:
            data.pop(key, None)
        elif isinstance(value, BaseModel):
            _without_unset(value, data[key])
        elif isinstance(value, (list, tuple)):
            for item, dumped in zip(value, data[key], strict=True):
                if isinstance(item, BaseModel):
                    _without_unset(item, dumped)
        elif isinstance(value, Mapping):
            for k, item in value.items():
                if isinstance(item, BaseModel):
                    _without_unset(item, data[key][k])
    return data


def _error_line(exc: ValidationError) -> tuple[str, str]:
    """The first validation error as (field path, message)."""
    errors = exc.errors()
    # A union (objective: one or a list) reports each branch; the one of the input's shape
    # says what is wrong inside it, the other only that the shape differs.
    shape = ("model_type", "list_type", "dict_type")
    err = next((e for e in errors if e["type"] not in shape), errors[0])
    loc = ".".join(str(part) for part in err["loc"] if not _UNION_BRANCH.match(str(part)))
    msg = str(err["msg"]).removeprefix("Value error, ")
    # whole-spec and block checks name their field first
    if _FIELD_PREFIX.match(msg) and (not loc or msg.startswith(f"{loc}.")):
        loc, msg = msg.split(": ", 1)
    if err["type"] == "extra_forbidden":
        msg = _unknown_key(loc, err.get("input"))
    elif isinstance(err.get("input"), str | int | float | bool) and "got" not in msg:
        msg = f"{msg}, got {err['input']!r}"
    return loc, msg


def _unknown_key(loc: str, value: Any) -> str:
    """``unknown key``, and what was meant where it can tell: a key of its block it misspells,
    or, at the top level, a knob of the trainable (it goes under ``space:`` or ``fixed:``).

    Example:
        >>> _unknown_key("budjet", 3), _unknown_key("budget.trails", 3)
        ("unknown key (did you mean 'budget'?)", "unknown key (did you mean 'trials'?)")
        >>> _unknown_key("hidden", {"choice": [32, 64]})
        'unknown key; a knob to search goes under space: (space: {hidden: {choice: ...}})'
    """
    *block, key = loc.split(".")
    hint = did_you_mean(key, _keys_at(block))
    if hint or block:
        return f"unknown key{hint}"
    if isinstance(value, Mapping) and (found := sorted(set(value) & _keys_at(["space", key]))):
        where = f"space: {{{key}: {{{found[0]}: ...}}}}"
        return f"unknown key; a knob to search goes under space: ({where})"
    return (
        f"unknown key; a knob of the trainable goes under fixed: (fixed: {{{key}: ...}}), "
        "or under space: to search it"
    )


def _keys_at(block: list[str]) -> set[str]:
    """The keys a spec accepts in ``block`` (``[]``: the top level; ``["budget"]``;
    ``["space", "lr"]``), as written in YAML (aliases such as ``int``); empty where any key
    goes (``fixed:``) or the block is unknown."""
    model: Any = StudySpec
    free = False  # the part is a key of the user's (a knob of space:), not a field
    for part in block:
        if free or part.isdigit():  # a knob's name, or an index into a list
            free = False
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None or (model := _model_in(field.annotation)) is None:
            return set()
        free = get_origin(field.annotation) is dict
    if free:
        return set()
    return {field.alias or name for name, field in model.model_fields.items()}


def _model_in(annotation: Any) -> Any:
    """The pydantic model an annotation holds (``X``, ``X | None``, ``list[X]``,
    ``dict[str, X]``), else ``None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in reversed(get_args(annotation)):
        if (found := _model_in(arg)) is not None:
            return found
    return None


def _non_finite(data: Any, path: str = "") -> tuple[str, float] | None:
    """The first NaN or infinite number in ``data``, as (dotted path, value)."""
    if isinstance(data, float) and not math.isfinite(data):
        return path, data
    if isinstance(data, dict):
        items: list[tuple[Any, Any]] = list(data.items())
    elif isinstance(data, list | tuple):
        items = list(enumerate(data))
    else:
        return None
    for key, value in items:
        found = _non_finite(value, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def parse_spec(data: Any, source: str = "<spec>", *, find_code: bool = True) -> StudySpec:
    """Validates already-loaded spec data.

    Args:
        data: The spec as YAML or JSON loads it.
        source: Where it came from, for the error line.
        find_code: Whether to check that the trainable's module can be found (which imports
            its parent package); a stored spec read back only to be shown does not.

    Raises:
        SpecError: One line naming ``source``, the field and what was expected.
    """
    if not isinstance(data, dict):
        raise SpecError(
            source, "", f"expected a mapping at the top level, got {type(data).__name__}"
        )
    # NaN and infinities pass pydantic's bounds but become null in the stored spec and in
    # best.yaml (JSON has neither); no field means them.
    try:
        bad = _non_finite(data)
    except RecursionError:
        raise SpecError(source, "", "nested too deeply") from None
    if bad is not None:
        raise SpecError(source, bad[0], f"expected a finite number, got {bad[1]}")
    try:
        return StudySpec.model_validate(data, context={"find_code": find_code})
    except ValidationError as exc:
        loc, msg = _error_line(exc)
        raise SpecError(source, loc, msg) from None


def load_spec(path: str | Path) -> StudySpec:
    """Reads and validates a YAML spec file (safe loader only)."""
    return parse_spec(read_spec_file(path), str(path))


def read_spec_file(path: str | Path) -> Any:
    """A YAML spec file's data, not yet validated (:func:`read_yaml`)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(str(path), "", f"cannot read file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SpecError(str(path), "", "cannot read file (not UTF-8 text)") from None
    return read_yaml(text, str(path))


def read_yaml(text: str, source: str) -> Any:
    """``text`` as YAML (safe loader only); a :class:`SpecError` naming ``source`` when it
    is not.

    Example:
        >>> read_yaml("study: demo", "<string>")
        {'study': 'demo'}
    """
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise SpecError(source, "", f"YAML syntax error{where}: {problem}") from None
    except RecursionError:
        raise SpecError(source, "", "YAML nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise SpecError(source, "", f"YAML value not readable: {exc}") from None


def set_dotted(data: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each ``a.b.c`` of ``changes`` set (``None`` values skipped), in place.

    Example:
        >>> set_dotted({"budget": {"trials": 8}}, {"budget.trials": 4, "study": None})
        {'budget': {'trials': 4}}
    """
    for dotted, value in changes.items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return data


def with_overrides(spec: StudySpec, source: str = "<cli>", **changes: Any) -> StudySpec:
    """Returns ``spec`` with dotted-path overrides applied (``None`` values are skipped).

    Example:
        >>> s = with_overrides(spec, **{"budget.trials": 4})  # doctest: +SKIP
    """
    return parse_spec(set_dotted(spec.to_dict(), changes), source)
