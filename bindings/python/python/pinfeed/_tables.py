"""Tables (Parquet, Arrow IPC, JSON lines) as records of chosen columns, and batches of those
records as a dict of arrays, one per column (issue 50). The Rust core lays a record out (each
column at an offset aligned to its element size); this module only names the columns and views
each one's bytes of a raw batch in place."""

import os
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

import numpy as np

from . import _pinfeed
from ._arrays import dtype_of
from .errors import PinfeedValueError


class ColumnView(NamedTuple):
    """Where one column lies in a record, and what it holds."""

    name: str
    offset: int
    nbytes: int
    dtype: np.dtype
    shape: tuple[int, ...]


def open_table(
    source: Any, columns: Optional[Sequence[str]], on_error: str, reader: str
) -> "_pinfeed.Source":
    """Opens ``source`` (a file, directory or glob of tables) as records of ``columns``."""
    if isinstance(columns, str):
        columns = [columns]
    names = None if columns is None else [str(c) for c in columns]
    if on_error not in ("raise", "skip"):
        raise PinfeedValueError(f'on_error={on_error!r}: expected "raise" or "skip"')
    path = os.fspath(source)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    return _pinfeed.open_table(path, names, on_error=on_error, reader=reader)


def table_block(source: "_pinfeed.Source", shuffle: Any, block_size: Optional[int]) -> Any:
    """``block_size`` for ``shuffle="block"`` over a table: a row group's rows unless given, so
    that each block decodes one row group (random order decodes one for nearly every record)."""
    if block_size is not None or shuffle != "block":
        return block_size
    return _pinfeed.natural_block(source)


def column_views(descr: str) -> list[ColumnView]:
    """The columns of records of the structured dtype ``descr``, padding left out."""
    dt = dtype_of(descr)
    views = []
    for name in dt.names or ():
        sub, offset = dt.fields[name][:2]
        views.append(ColumnView(name, int(offset), int(sub.itemsize), sub.base, tuple(sub.shape)))
    return views


def _torch_dtype(torch: Any, dt: np.dtype) -> Any:
    return torch.from_numpy(np.empty(0, dt)).dtype


def split(batch: Any, views: Sequence[ColumnView]) -> dict[str, Any]:
    """A raw batch (uint8, ``(rows, record_bytes)``) as ``{column: array}``, each a view of
    the batch's memory (no copy), of the column's dtype and shape ``(rows, *shape)``."""
    rows = int(batch.shape[0])
    if isinstance(batch, np.ndarray):
        return {
            v.name: batch[:, v.offset : v.offset + v.nbytes].view(v.dtype).reshape((rows, *v.shape))
            for v in views
        }
    module = type(batch).__module__.split(".")[0]
    if module == "torch":
        import torch

        return {
            v.name: batch[:, v.offset : v.offset + v.nbytes]
            .view(_torch_dtype(torch, v.dtype))
            .reshape((rows, *v.shape))
            for v in views
        }
    raise PinfeedValueError(
        f"columns= delivers torch tensors or numpy arrays so far, not {type(batch).__name__}"
    )
