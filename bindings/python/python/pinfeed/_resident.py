"""GPU-resident shuffling (``Loader(shuffle="gpu")``): :class:`ResidentShuffle`, and its parts:
the budget the resident copy must fit, the upload of the dataset into one array on the device
(numpy on the host backend), an epoch's index moved to that device, the batches gathered from
the copy by it, and the epoch orders computed ahead on worker threads (:class:`OrdersAhead`).
Which epoch and split a pass runs stays with the Loader (loader.py)."""

import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional

import numpy as np

from . import _pinfeed
from ._arrays import materialize, torch_module
from .errors import PinfeedError, PinfeedMemoryError

# Bytes in a batch of the upload: large copies, few batches.
_UPLOAD_BATCH_BYTES = 8 << 20


def upload_batch(record_bytes: int, pinned_budget: int) -> int:
    """Records in a batch of the upload, ``record_bytes`` the widest a record is on its way (read,
    transformed, exported): a few MiB whatever the training batch size, and a quarter of the
    pinned budget at most, so that the upload's ring keeps several slots."""
    return max(1, min(_UPLOAD_BATCH_BYTES, pinned_budget // 4) // record_bytes)


def check_budget(
    name: str, device: str, records: int, record_bytes: int, asked: Any, budget: Optional[int]
) -> None:
    """Refuses a resident copy of ``records`` records over its budget: ``budget`` where the user
    gave a ``device_budget`` (``asked``, as given), else half of what is free on the device (or
    of the host's available memory)."""
    need = records * record_bytes
    if asked is not None and budget is not None:
        limit, source = budget, f"device_budget={asked!r}"
    elif device.startswith("cuda"):
        torch = torch_module()
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        limit = free // 2
        source = f"half of the {free} bytes free on {device} (device_budget=None)"
    else:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
            return
        limit = avail // 2
        source = f"half of the {avail} bytes of available host memory (device_budget=None)"
    if need > limit:
        raise PinfeedMemoryError(
            f'{name}: shuffle="gpu" keeps the whole dataset on {device}: {records} records of '
            f"{record_bytes} bytes = {need} bytes, more than the {limit} bytes allowed "
            f"({source}); raise device_budget if the device has room, or stream the shuffled "
            'order instead with shuffle=True (random reads) or shuffle="block" (for slow random '
            "reads)"
        )


def upload(stream: Any, name: str, device: str, records: int, view: Any) -> Any:
    """The dataset in one array on ``device``: every batch of ``stream`` (the upload, in file
    order) copied in as it arrives. ``view``: the export's dtype view (see
    :func:`pinfeed._arrays.materialize`)."""
    out: Any = None
    filled = 0
    cuda = device.startswith("cuda")
    for buf in stream:
        batch = materialize(buf, view, False)
        k = int(batch.shape[0])
        if out is None:
            shape = (records,) + tuple(batch.shape[1:])
            if cuda:
                torch = torch_module()
                try:
                    out = torch.empty(shape, dtype=batch.dtype, device=batch.device)
                except torch.cuda.OutOfMemoryError as e:
                    stream.close()
                    raise PinfeedMemoryError(
                        f"{name}: no room on {device} for the resident copy of the dataset "
                        f"({records * stream.record_bytes} bytes); lower device_budget's share "
                        'or use shuffle=True or "block"'
                    ) from e
            else:
                out = np.empty(shape, dtype=batch.dtype)
        if cuda:
            out[filled : filled + k].copy_(batch)
        else:
            out[filled : filled + k] = batch
        filled += k
    if filled != records:  # pragma: no cover - the stream ends early only by raising
        raise PinfeedError(f"{name}: the upload delivered {filled} of {records} records")
    return out


def index_on_device(data: Any, host: Any) -> tuple[Any, Any]:
    """An epoch's int64 index (``host``: pinned torch memory, or a numpy array where the orders
    would not fit the pinned budget) on the CUDA device of ``data``, and the stream its copy was
    issued on (the current one)."""
    torch = torch_module()
    stream = torch.cuda.current_stream(data.device)
    if isinstance(host, np.ndarray):
        # Pageable: a synchronous copy.
        return torch.from_numpy(host).to(data.device), stream
    # Pinned: the copy is asynchronous, on the current stream. Dropping `host` is safe once the
    # copy is issued: torch's pinned-memory cache records an event on the block and reuses it
    # only after the copy has completed.
    return host.to(data.device, non_blocking=True), stream


def gather(
    data: Any,
    index: Any,
    copied_on: Any,
    batches: range,
    batch_size: int,
    torch: Any,
) -> Iterator[tuple[int, Any]]:
    """Batches ``batches`` of an epoch, each the records of ``index``'s slice gathered from the
    resident copy ``data``: on its CUDA device with ``torch`` (``copied_on`` the stream ``index``
    was copied on), or with numpy on the host, handed over as torch tensors where ``torch`` is
    given."""
    cuda = not isinstance(data, np.ndarray)
    # Streams this epoch's gathers ran on that are known to see the index.
    synced = [copied_on]
    for i in batches:
        sel = index[i * batch_size : (i + 1) * batch_size]
        if cuda:
            stream = torch.cuda.current_stream(data.device)
            if stream not in synced:
                # Gathered on another stream than the index was copied on: wait for the copy
                # (once: the stream stays ordered after it), and keep the index's memory from
                # the allocator until this stream is done with it.
                stream.wait_stream(copied_on)
                index.record_stream(stream)
                synced.append(stream)
            yield i, data.index_select(0, sel)
        else:
            batch = np.take(data, sel, axis=0)
            yield i, torch.from_numpy(batch) if torch is not None else batch


# The order workers of GPU-resident loaders still open: joined at exit by the hook of
# pinfeed._passes, after the loaders' passes, not killed inside Rust.
live_orders: "weakref.WeakSet[OrdersAhead]" = weakref.WeakSet()


def order_filler(device: str, pin: bool) -> Callable[[tuple[Any, ...]], Any]:
    """Computes the order of a key (``ResidentShuffle._key``) into a new int64 buffer: with
    ``pin``, a pinned torch tensor for a CUDA device (copied on without a synchronous pageable
    copy); a numpy array otherwise. It holds no reference to the Loader, so threads running it
    do not keep the Loader alive."""

    def fill(key: tuple[Any, ...]) -> Any:
        num_records, batch_size, rank, epoch, consumed, length, order = key
        if device.startswith("cuda") and pin:
            torch = torch_module()
            with torch.cuda.device(torch.device(device)):
                host = torch.empty(length, dtype=torch.int64, pin_memory=True)
            out = host.numpy()
        else:
            host = out = np.empty(length, dtype=np.int64)
        _pinfeed.epoch_order(
            num_records,
            batch_size,
            rank=rank,
            epoch=epoch,
            out=out,
            consumed=consumed,
            **dict(order),
        )
        return host

    return fill


class OrdersAhead:
    """Epoch orders of a GPU-resident Loader, computed ahead of need on a few worker threads
    (the Rust work runs without the GIL, beside the gathers of the current epoch) and kept until
    asked for or no longer wanted.

    Orders are keyed by everything they depend on (``ResidentShuffle._key``), so after
    set_epoch or load_state_dict a precomputed order is never used in the wrong place, merely
    dropped. The workers are started at the first :meth:`want` (starting a thread takes
    milliseconds, waking one microseconds) and stopped and joined by :meth:`close`: the Loader
    calls it from close() and when it is garbage-collected (the workers hold this object, not
    the Loader), and the exit hook of :mod:`pinfeed._passes` for any left. They are daemons so
    that a forgotten Loader never holds up exit. A forked child inherits no thread: there nothing is joined and no lock
    is taken (a parent thread may have held it at the fork).
    """

    def __init__(self, fill: Callable[[tuple[Any, ...]], Any], workers: int) -> None:
        self._fill = fill
        self._workers = workers
        self._pid = os.getpid()
        self._cond = threading.Condition()
        # All guarded by `_cond`. `_wanted`: in the order they will be needed; `_ready` holds
        # only wanted keys, with None for an order that failed (not tried again but by get(),
        # which raises the error); `_running` may hold a key no longer wanted (its result is
        # then dropped).
        self._wanted: list[tuple[Any, ...]] = []
        self._ready: dict[tuple[Any, ...], Any] = {}
        self._running: set[tuple[Any, ...]] = set()
        self._threads: list[threading.Thread] = []
        self._stop = False
        live_orders.add(self)

    def want(self, keys: Sequence[tuple[Any, ...]]) -> None:
        """Drops the orders kept for other keys and has those of ``keys`` not ready or running
        computed, first to last."""
        with self._cond:
            self._wanted = list(keys)
            for key in [k for k in self._ready if k not in self._wanted]:
                del self._ready[key]
            if self._next_job() is None:
                return
            self._stop = False
            self._threads = [t for t in self._threads if t.is_alive()]
            while len(self._threads) < self._workers:
                thread = threading.Thread(
                    target=self._work, name="pinfeed-order-ahead", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            self._cond.notify_all()

    def get(self, key: tuple[Any, ...]) -> Any:
        """The order of ``key``: the one computed ahead (waiting for it if it is being
        computed), else computed now, in the caller's thread, where any error is raised."""
        with self._cond:
            while key in self._running:
                self._cond.wait()
            host = self._ready.pop(key, None)
            if key in self._wanted:  # taken: not to be computed again
                self._wanted.remove(key)
        return self._fill(key) if host is None else host

    def _next_job(self) -> Optional[tuple[Any, ...]]:
        for key in self._wanted:
            if key not in self._ready and key not in self._running:
                return key
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                key = self._next_job()
                while not self._stop and key is None:
                    self._cond.wait()
                    key = self._next_job()
                if self._stop:
                    return
                self._running.add(key)
            try:
                host = self._fill(key)
            except Exception:
                host = None
            with self._cond:
                self._running.discard(key)
                if key in self._wanted:
                    self._ready[key] = host
                self._cond.notify_all()

    def close(self) -> None:
        """Drops the orders kept, stops the workers and joins them (one busy finishes its
        order first). A later :meth:`want` starts new ones."""
        if os.getpid() != self._pid:
            return
        with self._cond:
            self._stop = True
            self._wanted = []
            self._ready.clear()
            self._cond.notify_all()
            if threading.current_thread() in self._threads:
                # Run by a garbage collection inside a worker, which may hold `_cond` further
                # up its stack: joining the others could wait on it forever. They all end on
                # their own, at their next look at `_stop`.
                return
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()


# Epochs whose order is computed ahead while the current epoch is gathered, and worker threads
# computing them: two, so that a shuffle up to twice as slow as an epoch's gathers still keeps
# up, and the orders held (8 bytes a record each) stay few. 0: none.
ORDERS_AHEAD = 2
_U64_MAX = (1 << 64) - 1


class ResidentShuffle:
    """The GPU-resident mode of a Loader (``shuffle="gpu"``): the dataset uploaded once into
    one array on the device, each epoch's batches gathered from it by that epoch's order, and
    the orders of the next epochs computed ahead on worker threads (:class:`OrdersAhead`).

    It holds no reference to its Loader (whose passes ask it for batches), so that dropping the
    Loader stops the workers. Which epoch and split a pass runs stays with the Loader.
    """

    def __init__(
        self,
        name: str,
        device: str,
        num_records: int,
        batch_size: int,
        order: dict[str, Any],
        rank: int,
        pinned_budget: int,
    ) -> None:
        self.name, self.device = name, device
        self.num_records, self.batch_size, self.rank = num_records, batch_size, rank
        # Everything the order depends on but the epoch, the rank and the split.
        self._order = order
        # Checks the rank and drop_last against the dataset now, as a stream would, without
        # drawing an order: epoch 0's is drawn when its pass starts. `order_len`: records of
        # this rank in each epoch, what an order buffer holds.
        self.order_len, self.batches_per_epoch = self.split_size(0)
        # Index buffers are page-locked (copied on asynchronously) only when the ones held at
        # once fit the pinned budget; they are computed after the upload, whose ring has the
        # budget until then. Otherwise they stay pageable.
        pin = (ORDERS_AHEAD + 1) * 8 * self.order_len <= pinned_budget
        self._orders = OrdersAhead(order_filler(device, pin), ORDERS_AHEAD)
        self._data: Any = None
        # (order key, the epoch's index on the resident copy's device, the stream it was
        # copied on (CUDA) or None).
        self._index: Optional[tuple[Any, Any, Any]] = None

    def split_size(self, consumed: int) -> tuple[int, int]:
        """``(records, batches)`` of this rank in an epoch split after ``consumed`` records of
        its global order (the whole epoch for 0)."""
        return _pinfeed.epoch_size(
            self.num_records,
            self.batch_size,
            drop_last=self._order["drop_last"],
            rank=self.rank,
            world_size=self._order["world_size"],
            consumed=consumed,
        )

    def _key(self, epoch: int, consumed: int = 0) -> tuple[Any, ...]:
        """Everything the order of ``epoch`` (split after ``consumed`` records of its global
        order) on this rank depends on, and its length: a precomputed order is used only for
        the same key, never after set_epoch, load_state_dict or a change of any of these made
        it stale."""
        length = self.order_len if consumed == 0 else self.split_size(consumed)[0]
        return (
            self.num_records,
            self.batch_size,
            self.rank,
            epoch,
            consumed,
            length,
            tuple(sorted(self._order.items())),
        )

    def want(self, first: int, end: int, consumed: int = 0) -> None:
        """Has the orders of epochs ``first .. end`` (the first split after ``consumed``
        records) computed in the background (but the one already on the device)."""
        have = None if self._index is None else self._index[0]
        keys = [
            self._key(e, consumed if e == first else 0)
            for e in range(first, min(end, _U64_MAX + 1))
        ]
        self._orders.want([k for k in keys if k != have])

    def want_ahead(self, start: tuple[int, int, int]) -> None:
        """Has the orders of a pass from ``start`` and the epochs after it computed in the
        background."""
        if ORDERS_AHEAD:
            self.want(start[0], start[0] + 1 + ORDERS_AHEAD, start[2])

    @property
    def uploaded(self) -> bool:
        """Whether the dataset is on the device."""
        return self._data is not None

    def upload(self, stream: Any, view: Any) -> None:
        """Uploads the dataset once: ``stream`` (the upload pass, in file order) into one
        array. ``view``: the export's dtype view."""
        self._data = upload(stream, self.name, self.device, self.num_records, view)

    def _epoch_index(self, epoch: int, consumed: int) -> tuple[Any, Any]:
        """The int64 index of ``epoch`` on the resident copy's device, and (CUDA) the stream
        its copy was issued on. Usually computed ahead; the orders of the next epochs are
        started here, to be ready when those epochs begin."""
        key = self._key(epoch, consumed)
        if self._index is None or self._index[0] != key:
            host = self._orders.get(key)
            if self.device.startswith("cuda"):
                index, stream = index_on_device(self._data, host)
                self._index = (key, index, stream)
            else:
                self._index = (key, host, None)
            self.want(epoch + 1, epoch + 1 + ORDERS_AHEAD)
        return self._index[1], self._index[2]

    def batches(
        self, start: tuple[int, int, int], epochs: int, torch: Any
    ) -> Iterator[tuple[int, int, Any]]:
        """``(epoch, index, batch)`` of a pass of ``epochs`` epochs from ``start`` (epoch,
        batches done, records consumed before the split), gathered with ``torch`` (CUDA, or
        torch tensors on the host) or numpy (``torch`` None)."""
        for epoch in range(start[0], start[0] + epochs):
            consumed = start[2] if epoch == start[0] else 0
            index, copied_on = self._epoch_index(epoch, consumed)
            split = self.batches_per_epoch if consumed == 0 else self.split_size(consumed)[1]
            batches = range(start[1] if epoch == start[0] else 0, split)
            for i, batch in gather(self._data, index, copied_on, batches, self.batch_size, torch):
                yield epoch, i, batch

    def close(self) -> None:
        """Drops the resident copy and the orders, and stops the workers (a later pass
        uploads again)."""
        self._orders.close()
        self._data = None
        self._index = None
