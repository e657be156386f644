"""``pinfeed.Loader``: batches of a dataset on the GPU (or the host backend). It joins the
parts beside it: the source (``_sources``), the options (``_options``, checked in Rust), its
passes (``_passes``), the GPU-resident mode (``_resident``) and resume states (``_states``)."""

import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np

from . import _pinfeed
from ._arrays import Export, dtype_of, export_for, torch_module
from ._deprecation import accepts_old_spellings, as_torch, warn_once
from ._frameworks import check_delivery, framework_arg
from ._options import SHUFFLE_MODES, device_name, ints, shuffle_arg, warn_if_host_fallback
from ._passes import _Pass, _stream_batches, track
from ._resident import ResidentShuffle, check_budget, upload_batch
from ._sources import open_source, store_args
from ._states import merge_states, resumed_position
from ._tables import natural_block, table_columns
from .errors import PinfeedError
from .order import block_args, distributed_defaults, order_kind
from .transforms import transform_layout

__all__ = ["Loader", "merge_states"]

# A position: (epoch, batches done, records consumed before their split), the Rust `Position`.
_Position = tuple[int, int, int]


class Loader:
    """Batches of fixed-size records, streamed to the GPU through a bounded ring of pinned memory.

    ``source`` is a path to a ``.npy`` file or a raw record file (give ``dtype``, a numpy dtype or
    pinfeed's syntax such as ``"3,31,31B"``, and ``shape``, the per-record shape; for a ``.npy``
    file they may be left out, and given, must agree with its header), a C-contiguous numpy array
    or ``np.memmap`` (records along the first dimension; kept alive, not copied), or a torch CPU
    tensor.

    Iterating yields one batch at a time, of the source's dtype and shape ``(records,
    *record_shape)``: torch tensors on CUDA (through DLPack, ordered on torch's current stream, no
    host synchronisation), numpy arrays with ``device="cpu"`` (torch CPU tensors with
    ``framework="torch"``). ``raw=True`` gives the records' bytes as uint8 ``(records,
    record_bytes)``, the only way to stream structured dtypes to CUDA.

    ``framework`` picks the array: ``"torch"``, ``"jax"``, ``"cupy"`` (CUDA) or ``"numpy"`` (host),
    each holding its batch's memory until freed; ``shuffle="gpu"`` delivers torch or numpy.

    The first pass starts (and configuration errors surface) when the Loader is made; iterating
    again starts a new pass over ``epochs`` epochs. ``len(loader)`` is the number of batches a full
    pass gives this rank (``epochs`` × batches per epoch; a pass resumed mid-epoch gives fewer). At
    most ``pinned_budget`` bytes (int or ``"256MiB"``) are page-locked, once, per pass. A batch
    larger than ``piece_size`` (default ``"4MiB"``) is read in pieces of about that size, each its
    own pinned slot, filled by several reader threads at once and copied as each is filled;
    ``piece_size=None`` keeps every batch in one slot. Not with a ``transform`` (which sees whole
    batches) or ``reader="register"``.

    ``source`` may also be a directory or glob of ``.npy`` shards with one record layout, or
    ``.safetensors`` files (``tensor`` names the tensor whose first dimension counts records).
    ``reader`` is how files are read: ``"pread"`` (buffered reads into the pinned slots; one
    ``pread`` per record in shuffled order), ``"mmap"`` (as ``"pread"`` for runs of records, but
    shuffled batches are copied out of a read-only mapping of the file: one system call a batch
    instead of one a record), ``"direct"`` (``O_DIRECT``, bypassing the page cache), ``"uring"``
    (io_uring, several reads in flight), ``"register"`` (DMA straight from a registered mapping of
    a page-cached file, no CPU copy; in-order, one rank), or ``"auto"``: ``"mmap"`` for a file
    mostly in the page cache or smaller than half the memory available, ``O_DIRECT`` for a larger
    cold one. A dict of name to source, with ``weights={name: share}``, is a mixture (as
    :class:`pinfeed.TokenLoader`'s) of sources whose records agree in shape and dtype.

    ``source`` may also be a URL in object storage: ``s3://bucket/prefix/`` (its ``.npy`` objects,
    or its tables, as shards), a glob such as ``s3://bucket/train/part-*.npy``, one object, or ``gs://``,
    ``az://``, ``https://``. Records are fetched by ranged GETs straight into the pinned slots,
    neighbouring ranges coalesced, at most ``queue_depth`` (default 32) requests in flight over all
    reader threads. ``storage_options`` (a dict) sets the store's ``endpoint``, ``region``,
    ``path_style``, ``allow_http``, credentials and timeouts, and pinfeed's ``retries``;
    credentials otherwise come from the standard chain (``AWS_*`` variables, instance metadata);
    for ``https://`` a private certificate authority's roots are trusted with ``root_certificate``
    (a PEM file). ``cache_dir`` keeps fetched blocks on local disk for later epochs and other
    processes, at most ``cache_limit`` bytes (default 10 GiB). ``shuffle="random"`` works but
    fetches records one small range at a time: slow over a network; ``"block"`` reads large ranges.

    ``source`` may also be a table (Parquet, Arrow IPC file or stream, JSON lines plain or
    ``.gz``/``.zst``; a file, directory or glob, locally or in object storage) read as records of
    ``columns``: every batch is then a dict of arrays, one per column (numbers, fixed-size lists
    of numbers). Without ``columns`` every column is read, in the file's order (a JSON line's
    keys in name order); a column no record can hold (text, a variable-size list) is then
    refused, naming it and the ones that can be read. From object storage a Parquet object's
    footer and then only the chunks of the columns read are fetched, an Arrow IPC file's footer
    and those columns' buffers, an Arrow stream or JSON lines whole. A malformed JSON line is
    refused, or skipped and counted with ``on_error="skip"``. ``shuffle="block"`` takes a
    Parquet row group as its block, decoding each once an epoch; ``"random"`` decodes a row
    group for nearly every record once those touched outgrow the cache of decoded ones.

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
    (torch is never imported for this). Each epoch every rank gets the same number of batches: step
    ``i`` cuts the next ``world_size × batch_size`` records of the epoch's global order into one
    batch per rank. With ``drop_last=False`` the order is padded from its start to a multiple of
    ``world_size`` (fewer than ``world_size`` records come twice in that epoch, as with torch's
    ``DistributedSampler``) and the last batch may be partial (the same size on every rank); with
    ``drop_last=True`` every rank gets only full batches and fewer than ``world_size × batch_size``
    records are left out of the epoch (different ones each shuffled epoch).

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

    # Devices every batch is copied to, for a replicated MultiLoader; None for the one device.
    _replicas: Optional[list[str]] = None

    def __new__(cls, source: Any = None, *args: Any, **kwargs: Any) -> Any:
        if cls is Loader and isinstance(source, Mapping):  # a mixture: pinfeed/_mixed.py
            from ._mixed import MixedLoader

            return MixedLoader(source, *args, **kwargs)
        return super().__new__(cls)

    @accepts_old_spellings("Loader", as_torch)
    def __init__(
        self,
        source: Any,
        batch_size: int,
        *,
        device: Any = "auto",
        framework: Optional[str] = None,
        shuffle: Union[bool, str] = False,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: bool = False,
        pinned_budget: Any = None,
        num_threads: Optional[int] = None,
        prefetch: int = 4,
        storage_options: Optional[dict[str, Any]] = None,
        cache_dir: Any = None,
        cache_limit: Any = None,
        queue_depth: Optional[int] = None,
        epochs: int = 1,
        dtype: Any = None,
        shape: Optional[Sequence[int]] = None,
        transform: Any = None,
        transform_dtype: Any = None,
        transform_shape: Optional[Sequence[int]] = None,
        raw: bool = False,
        block_size: Optional[int] = None,
        block_window: Optional[int] = None,
        device_budget: Any = None,
        reader: str = "auto",
        tensor: Optional[str] = None,
        piece_size: Any = "4MiB",
        columns: Optional[Sequence[str]] = None,
        on_error: str = "raise",
    ) -> None:
        self._pid = os.getpid()
        store = store_args(storage_options, cache_dir, cache_limit, queue_depth, "Loader")
        self._source = open_source(source, dtype, shape, reader, tensor, store, columns, on_error)
        # Data the Loader opened itself is named in its states (TokenLoader's carry their own).
        self._data_fingerprint = None if isinstance(source, _pinfeed.Source) else ...
        #: ``"none"``, ``"random"``, ``"block"`` or ``"gpu"``.
        self.shuffle: str = shuffle_arg(shuffle, SHUFFLE_MODES, self._source.name)
        block_size = natural_block(self._source, self.shuffle, block_size)
        self.block_size, self.block_window = block_args(
            self.shuffle, int(self._source.record_bytes), block_size, block_window
        )
        #: What batches are delivered as: ``"torch"``, ``"jax"``, ``"cupy"``, ``"numpy"``, or
        #: None for the default (torch on CUDA, numpy on the host backend).
        self.framework: Optional[str] = framework_arg(framework)
        out_bytes = self._set_layout(transform, transform_dtype, transform_shape, raw)
        order = dict(seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        sizes = dict(pinned_budget=pinned_budget, device_budget=device_budget, epochs=epochs)
        reading = dict(num_threads=num_threads, prefetch=prefetch, piece_size=piece_size)
        self._configure(
            batch_size, {**order, **sizes, **reading}, device_name(device), str(reader), out_bytes
        )
        self._start_first_pass(device_budget, out_bytes)

    def _set_layout(
        self, transform: Any, transform_dtype: Any, transform_shape: Any, raw: Any
    ) -> Any:
        """Sets the transform, the dtype and record shape of the batches and how they are
        exported; returns the transform's output bytes a record (None: no Python transform)."""
        self.raw = bool(raw)
        # A table's records travel as bytes, cut into one array a column (_tables.split).
        self._columns = table_columns(self._source, transform)
        src_dtype = dtype_of(self._source.descr)
        src_shape = tuple(int(d) for d in self._source.record_shape)
        self._transform, out_bytes, out_dtype, out_shape = transform_layout(
            self.source_name, transform, transform_dtype, transform_shape, src_dtype, src_shape
        )
        #: numpy dtype and per-record shape of the batches (before ``raw``).
        self.dtype: np.dtype = out_dtype
        self.record_shape: tuple[int, ...] = out_shape
        self._export: Export = export_for(out_dtype, out_shape, self.raw or bool(self._columns))
        return out_bytes

    def _configure(
        self, batch_size: Any, numbers: dict[str, Any], device: str, reader: str, out_bytes: Any
    ) -> None:
        """Reads every number, size and name once, in Rust, and keeps what the passes and states
        need."""
        self.resident: bool = self.shuffle == "gpu"
        numbers["rank"], numbers["world_size"] = distributed_defaults(
            numbers["rank"], numbers["world_size"]
        )
        self._options = opts = _pinfeed.StreamOptions(
            self._source,
            batch_size,
            export_dtype=self._export.dl_dtype,
            record_shape=list(self._export.shape),
            device=device,
            transform=self._transform,
            transform_out_bytes=out_bytes,
            # Only register changes how batches reach the device; the others are ways of
            # reading into the pinned slots, chosen when the source opened.
            reader=reader,
            shuffle=order_kind(self.shuffle),
            block_size=self.block_size,
            block_window=self.block_window,
            **numbers,
            **({} if self._replicas is None else {"devices": self._replicas}),
        )
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
        # What each pass runs with: the loader's options, but the upload's in GPU-resident mode
        # (every record once, in file order, on one "rank", in batches of a few MiB; what
        # bounds the resident copy is checked apart, not the batches held during the upload).
        self._stream_options = opts
        if self.resident:
            widest = max(int(self._source.record_bytes), out_bytes or 0, self._record_bytes())
            self._stream_options = opts.upload(upload_batch(widest, opts.pinned_budget))
        self._fingerprint: int = opts.fingerprint
        self._reset_positions()

    def _reset_positions(self) -> None:
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
        self._resident: Optional[ResidentShuffle] = None

    def _start_first_pass(self, device_budget: Any, out_bytes: Any) -> None:
        """Starts the first pass (in GPU-resident mode, the upload) now: configuration errors
        surface here, and reading overlaps whatever the caller does before iterating."""
        self._pending: Optional[_pinfeed.Stream] = self._start((0, 0, 0))
        self._pending_start: _Position = (0, 0, 0)
        self.device: str = self._pending.device
        warn_if_host_fallback(self._options.device, self.device)
        try:
            check_delivery(self, out_bytes)
            if self.resident:
                record_bytes = int(self._pending.record_bytes)
                asked, budget = device_budget, self._options.device_budget
                check_budget(
                    self.source_name, self.device, self.num_samples, record_bytes, asked, budget
                )
                self._resident = ResidentShuffle(
                    self.source_name,
                    self.device,
                    self.num_samples,
                    self.batch_size,
                    self._order,
                    self.rank,
                    self._options.pinned_budget,
                )
                self._batches_per_epoch = self._resident.batches_per_epoch
            else:
                self._batches_per_epoch = int(self._pending.batches_per_epoch)
        except BaseException:
            self._pending.close()
            raise
        self._len = self._batches_per_epoch * self.epochs

    def _start(self, at: "_Position") -> "_pinfeed.Stream":
        stream = _pinfeed.Stream(
            self._stream_options, start_epoch=at[0], start_batches_done=at[1], start_consumed=at[2]
        )
        return track(stream)

    def _record_bytes(self) -> int:
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
            self.num_samples,
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
        # From inside this Loader's own transform: refused (in Rust) before anything changes.
        self._options.check_iter()
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
        if self._resident is not None:
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
        self._next_start = (ints(self.source_name, epoch=epoch)[0], 0, 0)

    def state_dict(self) -> dict[str, Any]:
        """How far the consumer got, as a plain dict for a checkpoint: ``epoch`` and
        ``batches_done`` (batches of that epoch this rank has *received*; an epoch received
        to its end reads as the next epoch with 0 done), ``consumed`` (0 but after an elastic
        resume: records of the epoch's global order consumed before the split ``batches_done``
        counts in), and what the position depends on: ``seed``, ``shuffle``, ``block_size``,
        ``block_window``, ``world_size``, ``rank``, ``num_records``, ``batch_size``,
        ``drop_last``, ``fingerprint`` (the Rust ``OrderSpec::fingerprint()``, a hash of all
        of them but the rank) and ``data_fingerprint`` (a hash of the data's layout, size and
        a few of its records: a state is not resumed on other data of the same size). After :meth:`set_epoch` or :meth:`load_state_dict` it is the
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
            "num_records": self.num_samples,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "fingerprint": self._fingerprint,
            **({} if self._data_fingerprint is None else {"data_fingerprint": self._data()}),
        }

    def _data(self) -> int:
        if self._data_fingerprint is ...:  # read once: it reads a few records
            self._data_fingerprint = int(self._source.data_fingerprint())
        return self._data_fingerprint

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
        self._next_start = resumed_position(
            self.source_name,
            state,
            self.state_dict(),
            self._options.fingerprint_at,
            self._split_batches,
        )
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

    def _resident_batches(self, start: "_Position") -> Any:
        """The batches of a GPU-resident pass from ``start``: the dataset uploaded first (by the
        pending upload pass, or a new one after close())."""
        resident = self._resident
        assert resident is not None
        if not resident.uploaded:
            stream, self._pending = self._pending, None
            self._stream = stream if stream is not None else self._start((0, 0, 0))
            resident.upload(self._stream, self._export.view)
        # Once the upload's ring has given its pinned memory back.
        resident.want_ahead(start)
        cuda = self.device.startswith("cuda")
        wanted = "torch tensors (framework='torch')"
        torch = (
            torch_module() if cuda else torch_module(wanted) if self.framework == "torch" else None
        )
        # A resident batch is records, not windows of documents: no count.
        return ((*b, None) for b in resident.batches(start, self.epochs, torch))

    def close(self) -> None:
        """Stops the current pass and frees its pinned memory (batches already out stay valid);
        asking that pass for another batch then raises :class:`pinfeed.PinfeedError`. A new
        iteration starts a new pass (in GPU-resident mode, which drops the resident copy here,
        after uploading again). Not from inside this Loader's own transform: that raises."""
        if os.getpid() == self._pid:
            for stream in (self._pending, self._stream):
                if stream is not None:
                    stream.close()
        if self._resident is not None:
            self._resident.close()
        self._pending = None
        self._closed_pass = self._pass_id

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
    def num_samples(self) -> int:
        """Records in the dataset (all ranks, one epoch)."""
        return int(self._source.num_records)

    @property
    def num_records(self) -> int:
        """Deprecated: :attr:`num_samples`."""
        warn_once("Loader", "num_records", "use num_samples instead")
        return self.num_samples

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
