"""Loads the dataset a spec names, once, in the driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from search.contract import UnknownTrainableError
from search.contract.dataset import image_folder, load_digits
from search.contract.registry import resolve_function
from search.errors import SearchError, error_summary

if TYPE_CHECKING:
    from search.specs.schema import DataSpec


class DataError(SearchError):
    """The spec's data cannot be loaded (one line)."""


@dataclass(frozen=True)
class SharedData:
    """The loaded data, once, in Ray's object store; the driver keeps the reference only.

    Tune's ``with_parameters`` takes an ``ObjectRef`` as it is, so trials read this one copy
    (NumPy arrays zero-copy), and the driver holds no second one beside it.

    Attributes:
        ref: The ``ray.ObjectRef`` of what :func:`load_data` returned.
        path: The image folder trials read themselves (``data.path``), else ``None``.
    """

    ref: Any
    path: str | None = None


def share(data: Any) -> SharedData:
    """Puts ``data`` in Ray's object store (Ray must be up); drop your own reference after."""
    import ray

    return SharedData(ray.put(data), getattr(data, "path", None))


def load_data(spec: DataSpec) -> Any:
    """Loads the data a validated :class:`~search.specs.schema.DataSpec` names: a built-in
    :class:`Dataset`, whatever the spec's ``loader`` returns (called once, here), or ``None``
    (``name: none``: the trainable loads its own).

    Raises:
        DataError: When the loader cannot be found, or raises.
    """
    if spec.loader is not None:
        fn = loader_function(spec.loader)
        try:
            return fn(**spec.args)
        except Exception as exc:
            raise DataError(
                f"data.loader: {spec.loader}(**args) raised {error_summary(exc)}; "
                "call it by hand to see the traceback"
            ) from exc
    if spec.name == "none":  # the trainable loads its own
        return None
    if spec.name == "image_folder":
        return image_folder(spec.path or "", spec.image_size, spec.val_fraction, spec.split_seed)
    return load_digits(spec.val_fraction, spec.split_seed)


def loader_function(name: str) -> Any:
    """The spec's ``loader`` function, imported.

    Raises:
        DataError: When its module or function is missing.
    """
    try:
        return resolve_function(name, "data.loader")
    except UnknownTrainableError as exc:
        raise DataError(str(exc)) from None
