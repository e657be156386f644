"""GPU-resident shuffling (``Loader(shuffle="gpu")``): the budget the resident copy must fit, the
upload of the dataset into one array on the device (numpy on the host backend), an epoch's index
moved to that device, and the batches gathered from the copy by it. Which epoch, split and order
a pass runs stays with the Loader (loader.py); the orders are computed ahead by
:mod:`pinfeed._orders_ahead`."""

import os
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np

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
