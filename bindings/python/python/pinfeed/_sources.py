"""Opening a source, and the object-store options that go with it: the one home of both, for
every loader (``storage_options``, ``cache_dir``, ``cache_limit`` and ``queue_depth`` mean the
same on each, and are refused for a local path, in Rust)."""

import os
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from . import _pinfeed
from ._arrays import descr_of, host_array, is_torch_tensor, split_dtype
from ._options import ints
from ._tables import open_table
from .errors import PinfeedTypeError, PinfeedValueError

__all__ = ["source_path", "store_args", "open_source", "local_only"]


def source_path(source: Any, what: str) -> str:
    """A path or URL given as ``str``, ``bytes`` or ``os.PathLike``, as a ``str``."""
    if not isinstance(source, (str, bytes, os.PathLike)):
        raise PinfeedTypeError(
            f"{what}: source must be a path (str or os.PathLike) or a URL, not "
            f"{type(source).__name__}"
        )
    return os.fsdecode(os.fspath(source))


def store_args(
    storage_options: Optional[dict[str, Any]],
    cache_dir: Any,
    cache_limit: Any,
    queue_depth: Any,
    what: str = "",
) -> dict[str, Any]:
    """The object-storage arguments of ``Source.open`` that were given (values as strings,
    as ``--storage-option key=value`` gives them: ``True`` becomes ``"true"``)."""
    store: dict[str, Any] = {}
    if storage_options:
        if not hasattr(storage_options, "items"):
            raise PinfeedTypeError(
                f"{what}: storage_options must be a dict of str to str, not "
                f"{type(storage_options).__name__}"
            )
        store["storage_options"] = {
            str(k): (str(v).lower() if isinstance(v, bool) else str(v))
            for k, v in storage_options.items()
        }
    if cache_dir is not None:
        store["cache_dir"] = os.fspath(cache_dir)
    if cache_limit is not None:
        store["cache_limit"] = cache_limit
    if queue_depth is not None:
        store["queue_depth"] = ints(what, queue_depth=queue_depth)[0]
    return store


def local_only(path: str, store: dict[str, Any], what: str) -> None:
    """Refuses a URL, and the object-store options, for a source read from local files only
    (image datasets)."""
    if _pinfeed.is_url(path):
        raise PinfeedValueError(
            f"{path}: {what} reads images from local files (an ImageFolder tree or .tar "
            "shards), not from object storage; copy the dataset to a local disk"
        )
    if store:
        raise PinfeedValueError(
            f"{path}: {', '.join(sorted(store))} apply to object-storage URLs (s3://, gs://, "
            "az://, https://) only"
        )


def record_shape(shape: Any, what: str) -> Optional[list[int]]:
    """The per-record ``shape`` given to a Loader, each dimension checked."""
    if shape is None:
        return None
    dims = list(np.atleast_1d(np.asarray(shape, dtype=object)))
    return ints(what, **{f"shape[{i}]": d for i, d in enumerate(dims)})


def open_source(
    source: Any,
    dtype: Any,
    shape: Optional[Sequence[int]],
    reader: str = "auto",
    tensor: Optional[str] = None,
    store: Optional[dict[str, Any]] = None,
    columns: Optional[Sequence[str]] = None,
    on_error: str = "raise",
) -> "_pinfeed.Source":
    """The source of a Loader: opened already (by TokenLoader or ImageLoader), a file, a
    directory or glob of shards, a URL, a numpy array or memmap, a torch CPU tensor, or the
    ``columns`` of a table (Parquet, Arrow IPC, JSON lines)."""
    if isinstance(source, _pinfeed.Source):
        return source
    reader = str(reader)
    if columns is not None or on_error != "raise":
        return _open_table(source, dtype, shape, reader, store, columns, on_error)
    if isinstance(source, (str, bytes, os.PathLike)):
        return _open_path(source_path(source, "Loader"), dtype, shape, reader, tensor, store)
    if is_torch_tensor(source):
        if source.dtype == __import__("torch").bfloat16:
            raise PinfeedValueError(
                "bfloat16 tensors cannot be streamed by the Loader yet (numpy has no bfloat16); "
                "pass source.view(torch.int16) and view the batches back as bfloat16"
            )
        source, _ = host_array(source)
    if isinstance(source, np.ndarray):
        if not source.flags.c_contiguous:
            raise PinfeedValueError(
                "host buffer: the array is not C-contiguous; pass numpy.ascontiguousarray(x) "
                "(a copy), or a file"
            )
        if source.ndim == 0:
            raise PinfeedValueError(
                "host buffer: a 0-d array holds no records; the first dimension is the record index"
            )
        return _pinfeed.Source.from_array(source, descr_of(source.dtype))
    raise PinfeedTypeError(
        "source must be a path to a .npy or raw record file, a numpy array (or memmap) or a "
        f"torch CPU tensor, not {type(source).__name__}"
    )


def _open_table(
    source: Any,
    dtype: Any,
    shape: Any,
    reader: str,
    store: Optional[dict[str, Any]],
    columns: Optional[Sequence[str]],
    on_error: str,
) -> "_pinfeed.Source":
    path = source_path(source, "Loader(columns=)")
    if dtype is not None or shape is not None:
        raise PinfeedValueError(
            f"{path}: columns= reads a table's own types; dtype and shape do not apply"
        )
    return open_table(path, columns, on_error, reader, store or {})


def _open_path(
    path: str,
    dtype: Any,
    shape: Optional[Sequence[int]],
    reader: str,
    tensor: Optional[str],
    store: Optional[dict[str, Any]],
) -> "_pinfeed.Source":
    dims = record_shape(shape, path)
    how: dict[str, Any] = dict(reader=reader, tensor=tensor, **(store or {}))
    if dtype is None:
        return _pinfeed.Source.open(path, shape=dims, **how)
    if isinstance(dtype, str):
        # pinfeed's dtype syntax, as on the command line: "3,31,31B", "f32", "<u8".
        return _pinfeed.Source.open(path, user_dtype=dtype, shape=dims, **how)
    base, sub = split_dtype(dtype)
    # No shape when none was given: a .npy header's is then not checked against it.
    full = None if dims is None and not sub else list(dims or ()) + list(sub)
    return _pinfeed.Source.open(path, descr=descr_of(base), shape=full, **how)
