"""``pinfeed.Loader``: batches of a dataset on the GPU (or the host backend)."""

import atexit
import os
import sys
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import (
    Any,
    Optional,
    Union,
)

import numpy as np

from . import _pinfeed
from ._arrays import (
    Export,
    descr_of,
    dtype_of,
    export_for,
    host_array,
    is_torch_tensor,
    split_dtype,
    torch_module,
)
from ._frameworks import check_device, check_dtype, deliver, framework_arg
from ._orders_ahead import OrdersAhead, live_orders, order_filler
from ._resident import check_budget, gather, index_on_device, upload, upload_batch
from ._tables import ColumnView, column_views, open_table, split, table_block  # [issue 50]
from .errors import PinfeedError, PinfeedValueError, PinfeedWarning
from .order import block_args, distributed_defaults, order_kind, shuffle_mode, u64_arg
from .transforms import Normalize, ToFloat, make_caller

__all__ = ["Loader"]

# Epochs whose GPU-resident order is computed ahead while the current epoch is gathered, and
# worker threads computing them: two, so that a shuffle up to twice as slow as an epoch's
# gathers still keeps up, and the orders held (8 bytes a record each) stay few. 0: none.
_ORDERS_AHEAD = 2
_U64_MAX = (1 << 64) - 1
# A loader position: (epoch, batches done, records consumed before their split); see the Rust
# `Position`.
_Position = tuple[int, int, int]


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One state for an elastic (or any) resume from the :meth:`Loader.state_dict` of several
    ranks of one job: the one that got least far, by ``epoch``, then records of the epoch's
    global order consumed (``consumed + batches_done × world_size × batch_size``). Resuming
    from it repeats the records faster ranks read past it, and loses none. When every rank
    saved at the same step, any one state is the same position. Raises
    :class:`pinfeed.PinfeedValueError` for no state, or states of different jobs (another
    ``fingerprint`` or ``world_size``)."""
    states = list(states)
    if not states:
        raise PinfeedValueError("merge_states: no state given")
    for key in ("fingerprint", "world_size", "batch_size"):
        seen = {s.get(key) for s in states}
        if len(seen) > 1:
            raise PinfeedValueError(
                f"merge_states: the states come from different jobs: {key} differs ({sorted(seen)})"
            )

    def position(state: Mapping[str, Any]) -> tuple[int, int]:
        step = int(state["world_size"]) * int(state["batch_size"])
        return int(state["epoch"]), int(state.get("consumed", 0)) + int(
            state["batches_done"]
        ) * step

    return dict(min(states, key=position))


# What as_torch=True asks for, in the error when torch is missing.
_AS_TORCH = "torch tensors (as_torch=True)"

# Passes still running, closed at exit so that no reader thread is left inside the interpreter
# while it shuts down; then the order workers of GPU-resident loaders (`live_orders`), joined.
_live_streams: "weakref.WeakSet[_pinfeed.Stream]" = weakref.WeakSet()


@atexit.register
def _close_live_streams() -> None:
    for closable in [*_live_streams, *live_orders]:
        try:
            closable.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass


def device_name(device: Any) -> str:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` from a string or a ``torch.device``."""
    if isinstance(device, int) and not isinstance(device, bool):
        return f"cuda:{device}"
    return str(device)


_warned_host_fallback = False


def warn_if_host_fallback(asked: str, got: str) -> None:
    """Warns, once a process, that ``device="auto"`` found no usable GPU and runs on the host
    backend (``device="cuda"`` raises instead)."""
    global _warned_host_fallback
    if asked.strip().lower() == "auto" and got == "cpu" and not _warned_host_fallback:
        _warned_host_fallback = True
        warnings.warn(
            'device="auto" found no usable CUDA driver and device: running on the host backend '
            '(batches in host memory); pass device="cpu" to ask for it, or device="cuda" to '
            "require a GPU",
            PinfeedWarning,
            stacklevel=_caller_outside_pinfeed(),
        )


def _caller_outside_pinfeed() -> int:
    """``warnings.warn``'s ``stacklevel`` for the first frame outside this package, so that a
    warning names the user's line whichever of pinfeed's classes was called."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1  # the function that calls warnings.warn
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _store_args(
    storage_options: Optional[dict[str, Any]],
    cache_dir: Any,
    cache_limit: Any,
    queue_depth: Optional[int],
) -> dict[str, Any]:
    """The object-storage arguments of ``Source.open`` that were given (values as strings,
    as ``--storage-option key=value`` gives them: ``True`` becomes ``"true"``)."""
    store: dict[str, Any] = {}
    if storage_options:
        store["storage_options"] = {
            str(k): (str(v).lower() if isinstance(v, bool) else str(v))
            for k, v in storage_options.items()
        }
    if cache_dir is not None:
        store["cache_dir"] = os.fspath(cache_dir)
    if cache_limit is not None:
        store["cache_limit"] = cache_limit
    if queue_depth is not None:
        store["queue_depth"] = int(queue_depth)
    return store


def _open_source(
    source: Any,
    dtype: Any,
    shape: Optional[Sequence[int]],
    reader: str = "auto",
    tensor: Optional[str] = None,
    store: Optional[dict[str, Any]] = None,
) -> "_pinfeed.Source":
    if isinstance(source, _pinfeed.Source):  # opened already, e.g. by pinfeed.TokenLoader
        return source
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        record_shape = None if shape is None else [int(d) for d in np.atleast_1d(shape)]
        how: dict[str, Any] = dict(reader=reader, tensor=tensor, **(store or {}))
        if dtype is None:
            return _pinfeed.Source.open(path, shape=record_shape, **how)
        if isinstance(dtype, str):
            # pinfeed's dtype syntax, as on the command line: "3,31,31B", "f32", "<u8".
            return _pinfeed.Source.open(path, user_dtype=dtype, shape=record_shape, **how)
        base, sub = split_dtype(dtype)
        # No shape when none was given: a .npy header's is then not checked against it.
        full = None if record_shape is None and not sub else list(record_shape or ()) + list(sub)
        return _pinfeed.Source.open(path, descr=descr_of(base), shape=full, **how)
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
    raise TypeError(
        "source must be a path to a .npy or raw record file, a numpy array (or memmap) or a "
        f"torch CPU tensor, not {type(source).__name__}"
    )


class Loader:
    """Batches of fixed-size records, streamed to the GPU through a bounded ring of pinned memory.

    ``source`` is a path to a ``.npy`` file or a raw record file (give ``dtype``, a numpy dtype or
    pinfeed's syntax such as ``"3,31,31B"``, and ``shape``, the per-record shape; for a ``.npy``
    file they may be left out, and given, must agree with its header), a C-contiguous
    numpy array or ``np.memmap`` (records along the first dimension; kept alive, not copied), or a
    torch CPU tensor.

    Iterating yields one batch at a time, of the source's dtype and shape
    ``(records, *record_shape)``: torch tensors on CUDA (through DLPack, ordered on torch's current
    stream, no host synchronisation), numpy arrays with ``device="cpu"`` (torch CPU tensors with
    ``as_torch=True``). ``raw=True`` gives the records' bytes as uint8 ``(records, record_bytes)``,
    the only way to stream structured dtypes to CUDA.

    ``framework`` picks the kind of array instead: ``"torch"`` (tensors, on the host backend
    too), ``"jax"`` (a ``jax.Array`` on the batch's device, through DLPack without a copy;
    64-bit dtypes need ``jax_enable_x64``), ``"cupy"`` (a ``cupy.ndarray`` ordered on CuPy's
    current stream; CUDA only) or ``"numpy"`` (host arrays; the host backend only). The
    package of each is imported when the Loader is made; torch is never imported for jax,
    cupy or numpy. Every kind keeps its batch's device memory until the array is freed
    (docs/ARCHITECTURE.md, "Python and DLPack"). ``shuffle="gpu"`` delivers torch or numpy.

    The first pass starts (and configuration errors surface) when the Loader is made; iterating
    again starts a new pass over ``epochs`` epochs. ``len(loader)`` is the number of batches a
    full pass gives this rank (``epochs`` × batches per epoch; a pass resumed mid-epoch gives
    fewer). At most ``pinned_budget`` bytes (int or ``"256MiB"``) are page-locked, once, per pass.
    A batch larger than ``piece_size`` (default ``"4MiB"``) is read in pieces of about that
    size, each its own pinned slot, filled by several reader threads at once and copied as each
    is filled; ``piece_size=None`` keeps every batch in one slot. Not with a ``transform``
    (which sees whole batches) or ``reader="register"``.

    ``source`` may also be a directory or glob of ``.npy`` shards with one record layout, or
    ``.safetensors`` files (``tensor`` names the tensor whose first dimension counts records).
    ``reader`` is how files are read: ``"pread"`` (buffered reads into the pinned slots; one
    ``pread`` per record in shuffled order), ``"mmap"`` (as ``"pread"`` for runs of records, but
    shuffled batches are copied out of a read-only mapping of the file: one system call a batch
    instead of one a record), ``"direct"`` (``O_DIRECT``, bypassing the page cache), ``"uring"``
    (io_uring, several reads in flight), ``"register"`` (DMA straight from a registered mapping
    of a page-cached file, no CPU copy; in-order, one rank), or ``"auto"``: ``"mmap"`` for a
    file mostly in the page cache or smaller than half the memory available, ``O_DIRECT`` for a
    larger cold one.

    ``source`` may also be a URL in object storage: ``s3://bucket/prefix/`` (its ``.npy``
    objects as shards), a glob such as ``s3://bucket/train/part-*.npy``, one object, or
    ``gs://``, ``az://``, ``https://``. Records are fetched by ranged GETs straight into the
    pinned slots, neighbouring ranges coalesced, at most ``queue_depth`` (default 32) requests
    in flight over all reader threads. ``storage_options`` (a dict) sets the store's
    ``endpoint``, ``region``, ``path_style``, ``allow_http``, credentials and timeouts, and
    pinfeed's ``retries``; credentials otherwise come from the standard chain (``AWS_*``
    variables, instance metadata); for ``https://`` a private certificate authority's roots
    are trusted with ``root_certificate`` (a PEM file). ``cache_dir`` keeps fetched blocks on local disk for later
    epochs and other processes, at most ``cache_limit`` bytes (default 10 GiB).
    ``shuffle="random"`` works but fetches records one small range at a time: slow over a
    network; ``"block"`` reads large ranges.

    ``source`` may also be a table: a Parquet file, an Arrow IPC file or stream (the ``datasets``
    cache), JSON lines (plain, ``.gz`` or ``.zst``), or a directory or glob of them. With
    ``columns=["x", "y"]`` each row is a record of those columns and every batch is a dict of
    arrays, one per column (numeric columns and fixed-size lists of numbers; text, variable-size
    lists and nulls are refused when opening, naming the column and row group; a malformed JSON
    line too, unless ``on_error="skip"``, which skips and counts it). Parquet is decoded a row
    group at a time, so ``shuffle="block"`` takes a row group as its block by default and decodes
    each once an epoch, while ``"random"`` decodes a row group for nearly every record once the
    row groups touched outgrow the 1 GiB cache of decoded ones.

    ``transform`` is run by the reader threads on each batch: ``transforms.ToFloat()``,
    ``transforms.Normalize(mean, std)`` (Rust, no GIL), or a Python callable ``f(raw, out)`` whose
    output dtype and per-record shape are ``transform_dtype``/``transform_shape`` (or the
    ``out_dtype``/``out_shape`` attributes of a :class:`pinfeed.transforms.Transform`).

    **Order.** ``shuffle`` picks how each epoch's records are ordered:

    - ``False`` / ``"none"``: file order.
    - ``True`` / ``"random"``: a uniformly random permutation each epoch; the readers fetch
      scattered records (fine from page cache or fast NVMe).
    - ``"block"``: quasi-random order for storage where random reads are slow: the records are
      cut into blocks of ``block_size`` consecutive records (default: as many as fit in 1 MiB),
      the blocks are shuffled, and the records of each window of ``block_window`` blocks (default
      16) are shuffled among themselves. A record lands less than ``block_window × block_size``
      positions from where its block would start.
    - ``"gpu"``: GPU-resident shuffling. The dataset (after ``transform``, which thus runs once)
      is uploaded once, sequentially through the ring, into one tensor on the device at the first
      iteration; each epoch then gathers its batches there with ``index_select``, in exactly the
      order ``"random"`` gives. It must fit ``device_budget`` (here: the bytes the resident copy
      may take; default half of the device's free memory, ``torch.cuda.mem_get_info``), else
      :class:`pinfeed.PinfeedMemoryError` is raised with advice; there is no silent fallback. With
      ``device="cpu"`` the copy is a numpy array (budget default: half of the available host
      memory) gathered with ``np.take``. The orders of the next two epochs are computed ahead
      on two background threads once the upload is done (8 bytes a record each, page-locked when
      three of them fit ``pinned_budget``, else pageable), so that an epoch rarely waits for its
      order; :meth:`close` stops them.

    The order is a pure function of ``(seed, epoch)`` (:func:`pinfeed.epoch_order` computes it).
    Each new iteration runs the epoch after the last one the previous pass started
    (``epochs`` later); :meth:`set_epoch` picks the epoch of the next iteration instead, as for
    torch's ``DistributedSampler`` (calling it every epoch is harmless; it is not needed).

    **Sharding.** ``rank`` and ``world_size`` default to ``torch.distributed``'s when a process
    group is initialised, else to ``$RANK``/``$WORLD_SIZE`` (torchrun sets them), else to 0 and 1
    (torch is never imported for this). Each epoch every rank gets the same number of batches:
    step ``i`` cuts the next ``world_size × batch_size`` records of the epoch's global order into
    one batch per rank. With ``drop_last=False`` the order is padded from its start to a multiple
    of ``world_size`` (fewer than ``world_size`` records come twice in that epoch, as with
    torch's ``DistributedSampler``) and the last batch may be partial (the same size on every
    rank); with ``drop_last=True`` every rank gets only full batches and fewer than
    ``world_size × batch_size`` records are left out of the epoch (different ones each shuffled
    epoch).

    **Resume.** :meth:`state_dict` says how far the consumer got: batches it has *received*
    (batches read ahead into the ring are not counted, so none is lost or repeated).
    :meth:`load_state_dict` makes the next iteration deliver exactly the rest of that epoch (then
    the following ``epochs - 1`` epochs). A state from another dataset size, batch size,
    ``drop_last``, seed or shuffle is refused. A state saved at another world size resumes
    elastically: the records the job consumed are skipped and the rest of the epoch is split
    over this world size (see :meth:`load_state_dict`; :func:`pinfeed.merge_states` for ranks
    saved at different steps).

    **One pass at a time.** Iterating again (in this thread or another) ends the pass under
    way: asking that older iterator for its next batch raises :class:`pinfeed.PinfeedError`
    rather than ending it quietly. :meth:`close` ends the pass likewise; a later iteration
    starts a new one.

    ``device`` is ``"auto"`` by default: the GPU when a CUDA driver and device exist, else the
    host backend, with a :class:`pinfeed.PinfeedWarning` (once a process). ``"cuda"`` requires
    the GPU (:class:`pinfeed.CudaError` without one); ``"cpu"`` asks for the host backend.

    A Loader cannot be used in a process forked after it was made (a DataLoader worker): make it
    in the child.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int,
        *,
        device: Any = "auto",
        drop_last: bool = False,
        shuffle: Union[bool, str] = False,
        seed: int = 0,
        block_size: Optional[int] = None,
        block_window: Optional[int] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        pinned_budget: Any = None,
        num_threads: Optional[int] = None,
        transform: Any = None,
        transform_dtype: Any = None,
        transform_shape: Optional[Sequence[int]] = None,
        dtype: Any = None,
        shape: Optional[Sequence[int]] = None,
        epochs: int = 1,
        raw: bool = False,
        as_torch: bool = False,
        prefetch: int = 4,
        device_budget: Any = None,
        reader: str = "auto",
        tensor: Optional[str] = None,
        piece_size: Any = "4MiB",
        framework: Optional[str] = None,
        storage_options: Optional[dict[str, Any]] = None,
        cache_dir: Any = None,
        cache_limit: Any = None,
        queue_depth: Optional[int] = None,
        columns: Optional[Sequence[str]] = None,
        on_error: str = "raise",
    ) -> None:
        self._pid = os.getpid()
        store = _store_args(storage_options, cache_dir, cache_limit, queue_depth)
        # [issue 50, tables] columns= opens a Parquet/Arrow/JSON-lines table as records of
        # those columns (_tables.py); batches are then dicts, one array per column.
        self._columns: Optional[list[ColumnView]] = None
        if columns is not None:
            if transform is not None or dtype is not None or shape is not None:
                raise PinfeedValueError(
                    "columns= reads a table's own types: transform, dtype and shape do not apply"
                )
            self._source = open_table(source, columns, str(on_error), str(reader))
            self._columns = column_views(self._source.descr)
            block_size = table_block(self._source, shuffle, block_size)
        else:
            self._source = _open_source(source, dtype, shape, str(reader), tensor, store)
        name = self._source.name
        #: ``"none"``, ``"random"``, ``"block"`` or ``"gpu"``.
        self.shuffle: str = shuffle_mode(shuffle)
        self.block_size, self.block_window = block_args(
            self.shuffle, int(self._source.record_bytes), block_size, block_window
        )
        rank, world_size = distributed_defaults(rank, world_size)
        self.raw = bool(raw)
        self.as_torch = bool(as_torch)
        if self.as_torch and framework is None:
            torch_module(_AS_TORCH)  # refused now rather than at the first batch
        #: What batches are delivered as: ``"torch"``, ``"jax"``, ``"cupy"``, ``"numpy"``, or
        #: None for the default (torch on CUDA, numpy on the host backend).
        self.framework: Optional[str] = framework_arg(framework, self.as_torch)
        self.resident: bool = self.shuffle == "gpu"

        src_dtype = dtype_of(self._source.descr)
        src_shape = tuple(int(d) for d in self._source.record_shape)
        self._transform, transform_out_bytes, out_dtype, out_shape = self._make_transform(
            transform, transform_dtype, transform_shape, src_dtype, src_shape
        )
        #: numpy dtype and per-record shape of the batches (before ``raw``).
        self.dtype: np.dtype = out_dtype
        self.record_shape: tuple[int, ...] = out_shape
        # [issue 50, tables] a table's records travel as bytes and are split per column.
        self._export: Export = export_for(out_dtype, out_shape, self.raw or bool(self._columns))
        # Every number, size and name is read and checked in Rust, once.
        self._options = _pinfeed.StreamOptions(
            self._source,
            batch_size,
            export_dtype=self._export.dl_dtype,
            record_shape=list(self._export.shape),
            drop_last=drop_last,
            epochs=epochs,
            pinned_budget=pinned_budget,
            device_budget=device_budget,
            num_threads=num_threads,
            device=device_name(device),
            prefetch=prefetch,
            piece_size=piece_size,
            transform=self._transform,
            transform_out_bytes=transform_out_bytes,
            # Parsed once, in Rust: only register changes how batches reach the device; the
            # others are ways of reading into the pinned slots, chosen when the source opened.
            reader=str(reader),
            shuffle=order_kind(self.shuffle),
            block_size=self.block_size,
            block_window=self.block_window,
            seed=seed,
            rank=rank,
            world_size=world_size,
            **({} if self._replicas is None else {"devices": self._replicas}),
        )
        opts = self._options
        self.batch_size: int = opts.batch_size
        self.drop_last: bool = opts.drop_last
        self.epochs: int = opts.epochs
        self.seed: int = opts.seed
        self.rank: int = opts.rank
        self.world_size: int = opts.world_size
        self._order: dict[str, Any] = dict(
            drop_last=self.drop_last,
            shuffle=order_kind(self.shuffle),
            block_size=self.block_size,
            block_window=self.block_window,
            seed=self.seed,
            world_size=self.world_size,
        )
        # What each pass runs with: the loader's options, but the upload's in GPU-resident mode.
        self._stream_options = opts
        if self.resident:
            # The upload: every record once, in file order, on one "rank", in batches of a few
            # MiB; what bounds the resident copy is checked below, not the batches held during
            # the upload.
            widest = max(
                int(self._source.record_bytes),
                transform_out_bytes or 0,
                self._export_record_bytes(),
            )
            self._stream_options = opts.upload(upload_batch(widest, opts.pinned_budget))
        self._fingerprint: int = opts.fingerprint
        # Positions are (epoch, batches of it done, records of its global order consumed before
        # the split those batches count in: 0 but after an elastic resume, see the Rust
        # `Position`). `_received`: what the consumer has been given; `_next_start`: where
        # set_epoch/load_state_dict want the next pass to start; `_pass_epoch`: the epoch the
        # latest pass started at (None before the first), `_pass_consumed` its `consumed`.
        self._received: _Position = (0, 0, 0)
        self._next_start: Optional[_Position] = None
        self._pass_epoch: Optional[int] = None
        self._pass_consumed = 0
        self._pass_id = 0
        # Set by close(): the pass then running was ended by it (see _Pass).
        self._closed_pass: Optional[int] = None
        self._stream: Optional[_pinfeed.Stream] = None
        self._resident_data: Any = None
        # (order key, the epoch's index on the resident copy's device, the stream it was
        # copied on (CUDA) or None).
        self._resident_order: Optional[tuple[Any, Any, Any]] = None
        self._orders: Optional[OrdersAhead] = None
        # The first pass (in GPU-resident mode, the upload) starts now: configuration errors
        # surface here, and reading overlaps whatever the caller does before iterating.
        self._pending: Optional[_pinfeed.Stream] = self._start((0, 0, 0))
        self._pending_start: _Position = (0, 0, 0)
        self.device: str = self._pending.device
        warn_if_host_fallback(opts.device, self.device)
        if self._export.view is not None and (
            self.device.startswith("cuda") or self.framework in ("jax", "cupy")
        ):
            self._pending.close()
            kind = self.framework or "torch"
            raise PinfeedValueError(
                f"{name}: dtype {out_dtype} has no {kind} equivalent ({kind} has no structured, "
                "string or date dtypes); pass raw=True for the records' bytes as uint8 "
                f"(records, {self._source.record_bytes if transform is None else transform_out_bytes}), "
                "or device='cpu' for numpy arrays"
            )
        try:
            check_device(self.framework, self.device, name)
            check_dtype(self.framework, np.uint8 if self.raw or self._columns else out_dtype, name)
            if self.resident and self.framework in ("jax", "cupy"):
                raise PinfeedValueError(
                    f'{name}: shuffle="gpu" gathers its batches with torch (numpy on the host); '
                    f"framework={self.framework!r} streams them instead: use shuffle=True or "
                    '"block"'
                )
        except BaseException:
            self._pending.close()
            raise
        if self.resident:
            try:
                check_budget(
                    name,
                    self.device,
                    self.num_records,
                    int(self._pending.record_bytes),
                    device_budget,
                    opts.device_budget,
                )
                # Checks the rank and drop_last against the dataset now, as a stream would,
                # without drawing an order: epoch 0's is drawn when its pass starts.
                # `_order_len`: records of this rank in each epoch, what an order buffer holds.
                self._order_len, self._batches_per_epoch = _pinfeed.epoch_size(
                    self.num_records,
                    self.batch_size,
                    drop_last=self.drop_last,
                    rank=self.rank,
                    world_size=self.world_size,
                )
            except BaseException:
                self._pending.close()
                raise
            # Index buffers are page-locked (copied on asynchronously) only when the ones held
            # at once fit the pinned budget; they are computed after the upload, whose ring has
            # the budget until then. Otherwise they stay pageable.
            pin = (_ORDERS_AHEAD + 1) * 8 * self._order_len <= opts.pinned_budget
            self._orders = OrdersAhead(order_filler(self.device, pin), _ORDERS_AHEAD)
        else:
            self._batches_per_epoch = int(self._pending.batches_per_epoch)
        self._len = self._batches_per_epoch * self.epochs

    def _make_transform(self, transform, transform_dtype, transform_shape, src_dtype, src_shape):
        if transform is None:
            if transform_dtype is not None or transform_shape is not None:
                raise PinfeedValueError(
                    f"{self._source.name}: transform_dtype/transform_shape given without a transform"
                )
            return None, None, src_dtype, src_shape
        if isinstance(transform, (ToFloat, Normalize)):
            return transform, None, np.dtype(np.float32), src_shape
        if not callable(transform):
            raise TypeError(f"transform must be callable, not {type(transform).__name__}")
        out_dtype = (
            transform_dtype
            if transform_dtype is not None
            else getattr(transform, "out_dtype", None)
        )
        out_shape = (
            transform_shape
            if transform_shape is not None
            else getattr(transform, "out_shape", None)
        )
        if out_dtype is None:
            base, sub = src_dtype, ()
        else:
            base, sub = split_dtype(out_dtype)
        shape = src_shape if out_shape is None else tuple(int(d) for d in np.atleast_1d(out_shape))
        shape = tuple(shape) + tuple(sub)
        out_bytes = base.itemsize * int(np.prod(shape, dtype=np.int64))
        if out_bytes <= 0:
            raise PinfeedValueError(
                f"{self._source.name}: the transform's output records (dtype {base}, shape {shape}) "
                "are empty"
            )
        caller = make_caller(transform, src_dtype, src_shape, base, shape)
        return caller, out_bytes, base, shape

    # Devices every batch is copied to, for a replicated MultiLoader; None for the one device.
    _replicas: Optional[list[str]] = None

    def _start(self, at: "_Position") -> "_pinfeed.Stream":
        stream = _pinfeed.Stream(
            self._stream_options, start_epoch=at[0], start_batches_done=at[1], start_consumed=at[2]
        )
        _live_streams.add(stream)
        return stream

    def _export_record_bytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.record_shape, dtype=np.int64)))

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:
            raise PinfeedError(
                f"{self._source.name}: this Loader was made in process {self._pid} and cannot be "
                f"used in forked child {os.getpid()} (its threads and CUDA state do not survive "
                "fork()); make the Loader in the child, e.g. in a DataLoader worker_init_fn"
            )

    def __len__(self) -> int:
        return self._len

    def _split_size(self, consumed: int) -> tuple[int, int]:
        """``(records, batches)`` of this rank in an epoch split after ``consumed`` records of
        its global order (the whole epoch for 0)."""
        return _pinfeed.epoch_size(
            self.num_records,
            self.batch_size,
            drop_last=self.drop_last,
            rank=self.rank,
            world_size=self.world_size,
            consumed=consumed,
        )

    def _split_batches(self, consumed: int) -> int:
        return self._batches_per_epoch if consumed == 0 else self._split_size(consumed)[1]

    def _pass_len(self, start: "_Position") -> int:
        """Batches of a pass from ``start``: the whole of ``epochs`` epochs, but the first is
        only its split's after an elastic resume."""
        if start[2] == 0:
            return self._batches_per_epoch * self.epochs
        return self._split_batches(start[2]) + self._batches_per_epoch * (self.epochs - 1)

    def __iter__(self) -> "_Pass":
        self._check_fork()
        if self._next_start is not None:
            start = self._next_start
        elif self._pass_epoch is None:
            start = (0, 0, 0)
        else:
            start = (self._pass_epoch + self.epochs, 0, 0)
        self._next_start = None
        self._pass_epoch, self._pass_consumed = start[0], start[2]
        self._received = start
        self._len = self._pass_len(start)
        self._pass_id += 1
        if self.resident:
            self._ensure_resident()
            # Once the upload's ring has given its pinned memory back (see _order_filler).
            if _ORDERS_AHEAD:
                self._orders_wanted(start[0], start[0] + 1 + _ORDERS_AHEAD, start[2])
            return _Pass(self, self._pass_id, self._resident_batches(start), None)
        stream, self._pending = self._pending, None
        if stream is not None and self._pending_start != start:
            stream.close()
            stream = None
        if self._stream is not None:
            # Free the previous pass's pinned ring before making the next one.
            self._stream.close()
        if stream is None:
            stream = self._start(start)
        self._stream = stream
        return _Pass(self, self._pass_id, _stream_batches(self, stream), stream)

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration run epoch ``epoch`` from its start (its order is a pure
        function of the seed and the epoch). Without it, each iteration runs the epoch after the
        previous pass's."""
        self._next_start = (u64_arg("epoch", epoch), 0, 0)

    def state_dict(self) -> dict[str, Any]:
        """How far the consumer got, as a plain dict for a checkpoint: ``epoch`` and
        ``batches_done`` (batches of that epoch this rank has *received*; an epoch received
        to its end reads as the next epoch with 0 done), ``consumed`` (0 but after an elastic
        resume: records of the epoch's global order consumed before the split ``batches_done``
        counts in), and what the position depends on: ``seed``, ``shuffle``, ``block_size``,
        ``block_window``, ``world_size``, ``rank``, ``num_records``, ``batch_size``,
        ``drop_last`` and ``fingerprint`` (the Rust ``OrderSpec::fingerprint()``, a hash of all
        of them but the rank). After :meth:`set_epoch` or :meth:`load_state_dict` it is the
        position the next iteration starts at."""
        epoch, done, consumed = self._next_start if self._next_start is not None else self._received
        return {
            "epoch": int(epoch),
            "batches_done": int(done),
            "consumed": int(consumed),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "block_size": self.block_size,
            "block_window": self.block_window,
            "world_size": self.world_size,
            "rank": self.rank,
            "num_records": self.num_records,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration resume at ``state`` (from :meth:`state_dict`): the rest of
        that epoch, then the following epochs. Raises :class:`pinfeed.PinfeedValueError` when
        the state was saved for another dataset size, batch size, ``drop_last``, seed or
        shuffle. The rank may differ; ``shuffle="gpu"`` and ``"random"`` share their order, so
        their states are interchangeable.

        **Same world size:** exactly the batches the interrupted run had not received. Each
        rank may load its own state; one rank's state serves all when every rank saved at the
        same step.

        **Another world size (elastic resume):** a state saved at ``W`` ranks resumes at this
        loader's ``W′`` (more or fewer ranks, or after a node was lost). A step cuts
        ``W × batch_size`` records from the epoch's global order, so the job had consumed its
        first ``consumed + batches_done × W × batch_size`` records; those are not repeated in
        that epoch. The rest is split over the ``W′`` ranks by the usual rules: every record of
        it once across ranks, equal batch counts, with ``drop_last=False`` fewer than ``W′``
        records of its start padding the last step, with ``drop_last=True`` fewer than
        ``W′ × batch_size`` records of its end left out. Padding of the old split is never
        consumed (it lies in an epoch's last step; a state saved after that step is the next
        epoch's start). ``len(self)`` is then that split's batches (plus ``epochs - 1`` whole
        epochs); the following epoch is an ordinary one at ``W′``.

        **Ranks at different steps:** "consumed" is counted at the state loaded. Every rank of
        the new job must load the same state; when the saved ranks were at different steps,
        load :func:`pinfeed.merge_states` of all of them (the one that got least far): the
        records the faster ranks read past it come again, none is lost. A single rank's state is
        correct when all ranks saved at the same step, as after a synchronised checkpoint."""
        name = self._source.name
        if not isinstance(state, Mapping) or not ("fingerprint" in state or "num_records" in state):
            raise PinfeedValueError(
                f"{name}: not a pinfeed Loader state (expected the dict of Loader.state_dict(), "
                f"with 'epoch', 'batches_done' and 'fingerprint'); got {type(state).__name__}"
            )
        for key in ("epoch", "batches_done"):
            if key not in state:
                raise PinfeedValueError(f"{name}: the loader state has no {key!r}")
        mine = self.state_dict()
        saved_world = u64_arg("world_size", state.get("world_size", self.world_size))
        if saved_world < 1:
            raise PinfeedValueError(f"{name}: the loader state has world_size {saved_world}")
        differs = []
        for key in ("num_records", "batch_size", "drop_last", "seed"):
            if key in state and state[key] != mine[key]:
                differs.append(f"{key} {state[key]!r} (this loader: {mine[key]!r})")
        if "shuffle" in state:
            try:
                theirs = order_kind(shuffle_mode(state["shuffle"]))
            except PinfeedValueError:
                theirs = repr(state["shuffle"])
            if theirs != order_kind(self.shuffle):
                differs.append(f"shuffle {state['shuffle']!r} (this loader: {self.shuffle!r})")
            elif theirs == "block":
                for key in ("block_size", "block_window"):
                    if key in state and state[key] != mine[key]:
                        differs.append(f"{key} {state[key]!r} (this loader: {mine[key]!r})")
        expected = self._options.fingerprint_at(saved_world)
        if not differs and "fingerprint" in state and state["fingerprint"] != expected:
            differs.append(
                f"order fingerprint {state['fingerprint']!r} (this loader at world size "
                f"{saved_world}: {expected!r})"
            )
        if differs:
            raise PinfeedValueError(
                f"{name}: cannot resume from this state: it was saved with "
                + ", ".join(differs)
                + "; a position means nothing under another dataset, batch size, drop_last, "
                "seed or shuffle"
            )
        epoch = u64_arg("epoch", state["epoch"])
        done = u64_arg("batches_done", state["batches_done"])
        consumed = u64_arg("consumed", state.get("consumed", 0))
        try:
            # The Rust rules check the position against its split and carry it to this
            # world size (unchanged when it is the same).
            epoch, done, consumed = _pinfeed.reshard_position(
                self.num_records,
                self.batch_size,
                drop_last=self.drop_last,
                epoch=epoch,
                batches_done=done,
                consumed=consumed,
                from_world_size=saved_world,
                to_world_size=self.world_size,
            )
        except PinfeedValueError as e:
            raise PinfeedValueError(f"{name}: {e}") from None
        if done == self._split_batches(consumed):
            epoch, done, consumed = epoch + 1, 0, 0
        self._next_start = (epoch, done, consumed)
        self._len = self._pass_len(self._next_start)

    def _received_batch(self, pass_id: int, epoch: int, index: int) -> None:
        if pass_id != self._pass_id:
            return  # a pass superseded by a newer one: it no longer speaks for the loader
        done = index + 1
        consumed = self._pass_consumed if epoch == self._pass_epoch else 0
        if done >= self._split_batches(consumed):
            self._received = (epoch + 1, 0, 0)
        else:
            self._received = (epoch, done, consumed)

    # GPU-resident shuffling.

    def _order_key(self, epoch: int, consumed: int = 0) -> tuple[Any, ...]:
        """Everything the order of ``epoch`` (split after ``consumed`` records of its global
        order) on this rank depends on, and its length: a precomputed order is used only for
        the same key, never after set_epoch, load_state_dict or a change of any of these made
        it stale."""
        length = self._order_len if consumed == 0 else self._split_size(consumed)[0]
        return (
            self.num_records,
            self.batch_size,
            self.rank,
            epoch,
            consumed,
            length,
            tuple(sorted(self._order.items())),
        )

    def _orders_wanted(self, first: int, end: int, consumed: int = 0) -> None:
        """Has the orders of epochs ``first .. end`` (the first split after ``consumed``
        records) computed in the background (but the one already on the device)."""
        if self._orders is not None:
            have = None if self._resident_order is None else self._resident_order[0]
            keys = [
                self._order_key(e, consumed if e == first else 0)
                for e in range(first, min(end, _U64_MAX + 1))
            ]
            self._orders.want([k for k in keys if k != have])

    def _ensure_resident(self) -> None:
        """Uploads the dataset once: the pending upload stream, in file order, into one array."""
        if self._resident_data is not None:
            return
        stream, self._pending = self._pending, None
        if stream is None:
            stream = self._start((0, 0, 0))
        self._stream = stream
        name, view = self._source.name, self._export.view
        self._resident_data = upload(stream, name, self.device, self.num_records, view)

    def _resident_index(self, epoch: int, consumed: int) -> tuple[Any, Any]:
        """The int64 index of ``epoch`` on the resident copy's device, and (CUDA) the stream
        its copy was issued on. Usually computed ahead (see :class:`pinfeed._orders_ahead.OrdersAhead`); the orders
        of the next epochs are started here, to be ready when those epochs begin."""
        key = self._order_key(epoch, consumed)
        if self._resident_order is None or self._resident_order[0] != key:
            assert self._orders is not None
            host = self._orders.get(key)
            if self.device.startswith("cuda"):
                index, stream = index_on_device(self._resident_data, host)
                self._resident_order = (key, index, stream)
            else:
                self._resident_order = (key, host, None)
            self._orders_wanted(epoch + 1, epoch + 1 + _ORDERS_AHEAD)
        return self._resident_order[1], self._resident_order[2]

    def _resident_batches(self, start: "_Position") -> Iterator[tuple[int, int, Any]]:
        cuda = self.device.startswith("cuda")
        as_torch = self.framework == "torch"
        torch = torch_module() if cuda else torch_module(_AS_TORCH) if as_torch else None
        data = self._resident_data
        for epoch in range(start[0], start[0] + self.epochs):
            consumed = start[2] if epoch == start[0] else 0
            index, copied_on = self._resident_index(epoch, consumed)
            batches = range(start[1] if epoch == start[0] else 0, self._split_batches(consumed))
            for i, batch in gather(data, index, copied_on, batches, self.batch_size, torch):
                yield epoch, i, batch

    def close(self) -> None:
        """Stops the current pass and frees its pinned memory (batches already out stay valid);
        asking that pass for another batch then raises :class:`pinfeed.PinfeedError`. A new
        iteration starts a new pass (in GPU-resident mode, which drops the resident copy here,
        after uploading again). Not from inside this Loader's own transform: that raises."""
        if os.getpid() == self._pid:
            for stream in (self._pending, self._stream):
                if stream is not None:
                    stream.close()
        if self._orders is not None:
            self._orders.close()
        self._pending = None
        self._closed_pass = self._pass_id
        self._resident_data = None
        self._resident_order = None

    def stats(self) -> dict[str, Any]:
        """Counters of the current (or last) pass: the Rust ``Stats`` fields (times in seconds,
        sizes in bytes), ``device_bytes_held``, ``gbps``, ``bottleneck`` and ``explanation``.
        In GPU-resident mode, those of the upload."""
        stream = self._stats_stream()
        return {} if stream is None else stream.stats()

    def _stats_stream(self) -> Optional["_pinfeed.Stream"]:
        """The pass whose counters :meth:`stats` gives: the current one, else the last."""
        return self._stream or self._pending

    @property
    def source_name(self) -> str:
        """The file path, or "host buffer"."""
        return self._source.name

    @property
    def num_records(self) -> int:
        """Records in the dataset."""
        return int(self._source.num_records)

    def __repr__(self) -> str:
        return (
            f"Loader({self._source.name!r}, batch_size={self.batch_size}, device={self.device!r}, "
            f"batches={self._len}, dtype={self.dtype}, record_shape={self.record_shape}, "
            f"shuffle={self.shuffle!r}, rank={self.rank}, world_size={self.world_size})"
        )

    def __del__(self) -> None:
        try:
            if os.getpid() == self._pid:
                self.close()
        except Exception:
            pass


def _stream_batches(loader: Loader, stream: "_pinfeed.Stream") -> Iterator[tuple[int, int, Any]]:
    view, framework = loader._export.view, loader.framework
    for buf in stream:
        epoch, index = buf.epoch, buf.index
        yield epoch, index, deliver(buf, view, framework)


class _Pass(Iterator[Any]):
    """One pass of a Loader: yields its batches and tells the loader which it has handed out."""

    def __init__(
        self,
        loader: Loader,
        pass_id: int,
        batches: Iterator[tuple[int, int, Any]],
        stream: Optional["_pinfeed.Stream"],
    ) -> None:
        self._loader = loader
        self._id = pass_id
        self._batches = batches
        self._stream = stream
        self._finished = False

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self) -> Any:
        loader = self._loader
        loader._check_fork()
        if self._finished:
            raise StopIteration
        if self._id != loader._pass_id:
            raise PinfeedError(
                f"{loader.source_name}: this pass was ended by a newer iteration of the same "
                "Loader (iter() again, in this thread or another); a Loader runs one pass at a "
                "time: finish or close() a pass before starting the next"
            )
        if self._id == loader._closed_pass:
            raise PinfeedError(f"{loader.source_name}: this pass was ended by Loader.close()")
        try:
            epoch, index, batch = next(self._batches)
        except StopIteration:
            self._finished = True
            if self._id == loader._pass_id:
                # The next pass is a whole one (or where set_epoch/load_state_dict put it).
                loader._len = loader._pass_len(loader._next_start or (0, 0, 0))
            raise
        loader._received_batch(self._id, epoch, index)
        if loader._columns is not None:  # [issue 50, tables]
            return split(batch, loader._columns)
        return batch

    def __len__(self) -> int:
        return self._loader._len

    def close(self) -> None:
        """Stops the pass now."""
        if self._stream is not None:
            self._stream.close()
        self._batches = iter(())
