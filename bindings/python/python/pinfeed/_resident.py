"""GPU-resident shuffling (``Loader(shuffle="gpu")``): :class:`ResidentShuffle`, and its parts:
the budget the resident copy must fit, the upload of the dataset into one array on the device
(numpy on the host backend), an epoch's index moved to that device, and the batches gathered
from the copy by it. Which epoch and split a pass runs stays with the Loader (loader.py); the
orders are computed ahead by :mod:`pinfeed._orders_ahead`'s worker threads."""

import os
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np

from . import _pinfeed
from ._arrays import materialize, torch_module
from ._orders_ahead import OrdersAhead, order_filler
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
