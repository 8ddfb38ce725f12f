"""Loads the dataset a spec names, once, in the driver."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.contract import UnknownTrainableError
from search.contract.dataset import image_folder, load_digits, load_shapes
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
    """Puts ``data`` in Ray's object store (Ray must be up); drop your own reference after,
    then call :func:`give_back_memory`."""
    import ray

    return SharedData(ray.put(data), getattr(data, "path", None))


MADV_DONTNEED = 4
"""Linux's ``madvise`` advice that drops a range's pages from this process (a shared mapping's
contents stay in its file, and come back on the next read)."""


def give_back_memory() -> None:
    """Hands the memory of the data the driver put in the object store back, once it dropped
    its reference: the loader's freed arrays (glibc keeps freed memory of a loader's thread in
    its arena: ``malloc_trim``) and the object store's pages the put wrote through this
    process's mapping of it (shared memory, the one copy the trials read, yet counted in the
    driver's RSS, which the kernel's out-of-memory killer ranks by). Nothing of the data is
    lost; elsewhere than Linux with glibc, only the garbage collection.
    """
    import ctypes
    import gc

    gc.collect()
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
        madvise = libc.madvise
    except (OSError, AttributeError):  # not glibc
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for start, end in object_store_mappings():
        madvise(start, end - start, MADV_DONTNEED)


def object_store_mappings(maps: str = "/proc/self/maps") -> list[tuple[int, int]]:
    """The address ranges of this process's shared mappings of Ray's object store (its
    ``plasma`` files); none where ``maps`` cannot be read.

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("w", delete=False) as fh:
        ...     _ = fh.write("7f00-7f80 rw-s 00000000 00:1b 123 /dev/shm/plasmaZL (deleted)\\n"
        ...                  "7f80-7f90 rw-p 00000000 00:00 0\\n")
        >>> object_store_mappings(fh.name)
        [(32512, 32640)]
    """
    found = []
    try:
        lines = Path(maps).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1].endswith("s") and "/plasma" in fields[5]:
            start, _, end = fields[0].partition("-")
            found.append((int(start, 16), int(end, 16)))
    return found


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
    if spec.name == "shapes":
        return load_shapes(
            spec.val_fraction, spec.split_seed, spec.samples, spec.difficulty, spec.image_size
        )
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
