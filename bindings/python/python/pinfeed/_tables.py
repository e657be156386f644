"""Tables (Parquet, Arrow IPC, JSON lines) as records of chosen columns, and batches of those
records as a dict of arrays, one per column (issue 50). The Rust core lays a record out (each
column at an offset aligned to its element size); this module only names the columns and views
each one's bytes of a raw batch in place."""

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Optional

import numpy as np

from . import _pinfeed
from ._arrays import dtype_of, torch_module
from ._options import shuffle_arg
from .errors import PinfeedError, PinfeedTypeError, PinfeedValueError


class ColumnView(NamedTuple):
    """Where one column lies in a record, and what it holds."""

    name: str
    offset: int
    nbytes: int
    dtype: np.dtype
    shape: tuple[int, ...]


def open_table(
    path: str, columns: Any, on_error: Any, reader: str, store: dict[str, Any]
) -> "_pinfeed.Source":
    """Opens ``path`` (a file, directory or glob of tables, or a URL of them in object storage,
    read as ``store`` says) as records of ``columns`` (None: all of the table's)."""
    if isinstance(columns, str):
        columns = [columns]
    if columns is not None and (
        not isinstance(columns, Sequence) or not all(isinstance(c, str) for c in columns)
    ):
        raise PinfeedTypeError(
            f"{path}: columns must be a list of column names (str), not {columns!r}"
        )
    if on_error not in ("raise", "skip"):
        raise PinfeedValueError(f'{path}: on_error={on_error!r}: expected "raise" or "skip"')
    names = None if columns is None else list(columns)
    return _pinfeed.open_table(path, names, on_error=on_error, reader=reader, **store)


def natural_block(source: "_pinfeed.Source", shuffle: str, block_size: Optional[int]) -> Any:
    """``block_size`` for ``shuffle="block"``: a Parquet row group's rows unless given, so
    that each block decodes one row group (random order decodes one for nearly every record)."""
    if block_size is not None or shuffle != "block":
        return block_size
    return _pinfeed.natural_block(source)


def table_columns(source: "_pinfeed.Source", transform: Any) -> Optional[list["ColumnView"]]:
    """Where each column lies in the records of a table, opened with ``columns`` or without
    (all of its columns); None for other sources."""
    if source.columns is None:
        return None
    if transform is not None:
        raise PinfeedValueError(
            f"{source.name}: a table's columns are read as their own types; a transform does "
            "not apply"
        )
    return column_views(source.descr)


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


def open_column(
    path: str,
    column: Any,
    tokenizer: Any,
    bos_eos: tuple[Any, Any],
    token_dtype: Optional[str],
    documents: bool,
    store: dict[str, Any],
) -> tuple["_pinfeed.TokenStream", Optional[tuple[Optional[int], Optional[int]]]]:
    """A table's ``column`` as a token stream: integer lists as they are, or text tokenized
    with ``tokenizer`` (a ``tokenizer.json``); then also the ids of ``bos_eos`` (tokens or
    ids; None when not given), else None. With ``documents`` the stream keeps where each row
    starts (``sample="documents"``). A URL is read from object storage as ``store`` says."""
    if not isinstance(column, str):
        raise PinfeedTypeError(
            f"{path}: column must name a table's column (str), not {type(column).__name__}"
            + (" (tokenizer= reads a column of text: give column= too)" if column is None else "")
        )
    bos, eos = bos_eos
    if tokenizer is None:
        if bos is not None or eos is not None:
            raise PinfeedValueError(
                f"{path}: bos_token and eos_token apply to text tokenized with tokenizer="
            )
        opened = _pinfeed.open_token_column(
            path, column, dtype=token_dtype, documents=documents, **store
        )
        return opened, None
    if token_dtype is not None:
        raise PinfeedValueError(
            f"{path}: a tokenized text column is uint32 tokens; leave token_dtype out"
        )
    if not isinstance(tokenizer, (str, os.PathLike)):
        raise PinfeedTypeError(
            f"{path}: tokenizer must be the path of a tokenizer.json, not "
            f"{type(tokenizer).__name__}"
        )
    stream, bos_id, eos_id = _pinfeed.open_text_column(
        path, column, os.fspath(tokenizer), bos=bos, eos=eos, documents=documents, **store
    )
    return stream, (bos_id, eos_id)


def token_shuffle(shuffle: Any, mode: str, table: bool) -> str:
    """``TokenLoader``'s shuffle mode, ``mode`` as :func:`shuffle_arg` read ``shuffle``: for a
    table's column ``True`` is ``"block"`` (row group by row group); token files cannot shuffle
    ``"block"``, and are refused naming the modes they can."""
    if table and isinstance(shuffle, (bool, np.bool_)) and shuffle:
        return "block"
    if not table and mode == "block":
        shuffle_arg(shuffle, ("none", "random"), "TokenLoader of token files")
    return mode


def decodes_of(opened: Optional["_pinfeed.TokenStream"]) -> Optional[int]:
    """Row groups that reads of a table's column (``opened``) have decoded so far; None for
    other token data."""
    return None if opened is None else opened.chunk_decodes


def with_decodes(stats: dict[str, Any], opened: Any, before: Optional[int]) -> dict[str, Any]:
    """``stats`` with, for a table's column, the row groups decoded since ``before`` (a
    :func:`decodes_of`) in ``"chunk_decodes"``."""
    now = decodes_of(opened)
    if now is not None:
        stats["chunk_decodes"] = now - (before or 0)
    return stats


def packed(
    steps: Iterator[tuple[Any, ...]],
    text: tuple[Any, Any],
    device: str,
    documents: Callable[[], Optional[int]],
) -> Iterator[Any]:
    """:func:`packing` of each of ``steps`` (``text`` is ``(bos, eos)``; ``documents()`` the
    reader threads' count of the step just taken). On a CUDA device each step is taken (its
    batch handed over), widened and packed on a stream of pinfeed's, which the consumer's
    stream then waits for; nothing on the host waits for the device."""
    if not device.startswith("cuda"):
        for step in steps:
            yield packing(step, *text, documents())
        return
    torch = torch_module()
    side = torch.cuda.Stream(device=device)
    while True:
        with torch.cuda.stream(side):
            step = next(steps, None)
            if step is None:
                return
            out = packing(step, *text, documents())
        consumer = torch.cuda.current_stream(device)
        consumer.wait_stream(side)
        for t in out:
            # Made on `side`: the allocator must not hand their memory to `side` again
            # before the consumer's reads of them are done.
            t.record_stream(consumer)
        yield out


def packing(
    step: tuple[Any, ...], bos: Optional[int], eos: Optional[int], documents: Optional[int]
) -> tuple[Any, ...]:
    """``(x, y, segment_ids, position_ids, cu_seqlens)`` of a step of packed documents, from
    ``(x, y)`` or, for document windows, ``(x, y, segment_ids)``: a document starts at each
    window's start, and where the segment ids change or else at ``bos`` and after ``eos``;
    ``segment_ids`` are each input token's document ordinal in its window, ``position_ids``
    restart at 0 at each document, and ``cu_seqlens`` (int32) are the documents' boundaries in
    the flattened batch, as variable-length attention kernels take them. ``documents``, the
    reader threads' count of the step's documents by the same rule (``Source::documents_in``),
    sizes ``cu_seqlens`` without reading the starts back from the device; on the host the
    two are checked to agree."""
    x, y = step[:2]
    if isinstance(x, np.ndarray):
        xp, accumulate = np, lambda a: np.maximum.accumulate(a, axis=1)
    elif type(x).__module__.split(".")[0] == "torch":
        import torch as xp

        def accumulate(a: Any) -> Any:
            return xp.cummax(a, dim=1).values
    else:
        raise PinfeedValueError("text columns deliver torch tensors or numpy arrays so far")
    if documents is None:
        raise PinfeedError(
            "a text step came without the reader threads' count of its documents; this is a "
            "bug in pinfeed: please report it"
        )
    rows, length = int(x.shape[0]), int(x.shape[1])
    if xp is np:
        starts = np.zeros(x.shape, dtype=bool)
    else:
        starts = xp.zeros(x.shape, dtype=xp.bool, device=x.device)
    if len(step) == 3:
        starts[:, 1:] = step[2][:, 1:] != step[2][:, :-1]
    else:
        if bos is not None:
            starts |= x == bos
        if eos is not None:
            starts[:, 1:] |= x[:, :-1] == eos
    starts[:, 0] = True
    segment_ids = (
        (starts.cumsum(1) - 1).astype(np.int32) if xp is np else (starts.cumsum(1) - 1).int()
    )
    index = np.arange(length) if xp is np else xp.arange(length, device=x.device)
    first = accumulate(xp.where(starts, index, 0))
    position_ids = index - first
    flat = starts.reshape(-1)
    if xp is np:
        cu = np.append(np.flatnonzero(flat), rows * length).astype(np.int32)
        _check_count(len(cu) - 1, documents)
    else:
        if x.device.type == "cpu":
            _check_count(int(flat.sum()), documents)
        cu = _cut_at_starts(xp, flat, documents)
    return x, y, segment_ids, position_ids, cu


def _cut_at_starts(torch: Any, flat: Any, count: int) -> Any:
    """The positions of the ``count`` True entries of ``flat``, then its length, as int32:
    what ``nonzero`` gives, made without reading ``count`` back from the device."""
    n = flat.numel()
    positions = torch.arange(n, device=flat.device)
    # Each start to its rank among the starts, every other position to a slot of its own past
    # them: no two writes meet, so the scatter is deterministic.
    target = torch.where(flat, flat.cumsum(0) - 1, count + 1 + positions)
    out = torch.empty(count + 1 + n, dtype=torch.int64, device=flat.device)
    out.scatter_(0, target, positions)
    # fill_ passes n to the kernel: `out[count] = n` copies it from pageable host memory,
    # which waits for the stream.
    out[count : count + 1].fill_(n)
    return out[: count + 1].int()


def _check_count(found: int, documents: int) -> None:
    """Fails where the reader threads' count of a step's documents is not what the host
    found: the two apply one rule (``Source::documents_in``), so this is a bug."""
    if found != documents:
        raise PinfeedError(
            f"a step of {found} documents was counted as {documents} on the reader threads; "
            "this is a bug in pinfeed: please report it"
        )
