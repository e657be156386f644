"""``prefetch``, ``to_device`` and ``pinned``: moving arbitrary arrays without per-batch pinning."""

import atexit
import os
import contextlib
import queue
import threading
import weakref
from typing import Any, Dict, Iterable, Iterator, Optional, Tuple

import numpy as np

from . import _pinfeed
from ._arrays import export_for, host_array, is_torch_tensor, materialize
from .loader import device_name

__all__ = ["prefetch", "to_device", "pinned", "Prefetcher", "free_staging_memory"]

_live_prefetchers: "weakref.WeakSet[Prefetcher]" = weakref.WeakSet()


@atexit.register
def _stop_prefetchers() -> None:
    for p in list(_live_prefetchers):
        p.close(timeout=1.0)


def _is_array_leaf(x: Any) -> bool:
    if isinstance(x, np.ndarray):
        return True
    return is_torch_tensor(x) and x.device.type == "cpu"


class _Staged:
    """An uploaded leaf: its buffer and how to view it once exported."""

    __slots__ = ("buf", "view")

    def __init__(self, buf: "_pinfeed.DeviceBuffer", view: Any) -> None:
        self.buf = buf
        self.view = view


def _upload_leaf(x: Any, upload) -> _Staged:
    arr, override = host_array(x)
    # numpy arrays never keep a sub-array dtype (it becomes trailing dimensions).
    export = export_for(arr.dtype, tuple(arr.shape))
    if export.view is None:
        return _Staged(upload(arr, tuple(override or export.dl_dtype), list(arr.shape)), None)
    # No DLPack dtype (structured, strings, dates): the bytes travel as uint8 (..., itemsize)
    # and are viewed back as the dtype on the host.
    buf = upload(arr, (1, 8, 1), list(arr.shape) + [arr.dtype.itemsize])
    return _Staged(buf, (arr.dtype, ()))


def _map_tree(x: Any, leaf, is_leaf) -> Any:
    if is_leaf(x):
        return leaf(x)
    if isinstance(x, dict):
        items = [(k, _map_tree(v, leaf, is_leaf)) for k, v in x.items()]
        try:
            return type(x)(items)
        except TypeError:
            return dict(items)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*(_map_tree(v, leaf, is_leaf) for v in x))
    if isinstance(x, (list, tuple)):
        items = [_map_tree(v, leaf, is_leaf) for v in x]
        try:
            return type(x)(items)
        except TypeError:
            return list(items) if isinstance(x, list) else tuple(items)
    return x


def _materialize_staged(s: _Staged) -> Any:
    return materialize(s.buf, s.view, False)


class _State:
    """What the worker thread and the consumer share (never the Prefetcher itself, so that
    dropping the Prefetcher stops the worker)."""

    def __init__(self, depth: int) -> None:
        self.queue: "queue.Queue[Any]" = queue.Queue(maxsize=depth)
        self.stop = threading.Event()

    def put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False


def _worker(it: Iterator[Any], stager: "_pinfeed.Stager", state: _State) -> None:
    try:
        for item in it:
            if state.stop.is_set():
                return
            staged = _map_tree(item, lambda x: _upload_leaf(x, stager.upload), _is_array_leaf)
            if not state.put(("item", staged)):
                return
        state.put(("end", None))
    except BaseException as e:  # re-raised in the consumer
        state.put(("error", e))


class Prefetcher(Iterator[Any]):
    """Iterator returned by :func:`prefetch`; ``close()`` (or dropping it) stops its thread."""

    def __init__(
        self,
        iterable: Iterable[Any],
        device: Any = "cuda",
        depth: int = 2,
        pinned_budget: Any = None,
        num_threads: Optional[int] = None,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._stager = _pinfeed.Stager(device_name(device), pinned_budget, num_threads)
        self.device: str = self._stager.device
        self._state = _State(depth)
        self._done = False
        self._thread = threading.Thread(
            target=_worker,
            args=(iter(iterable), self._stager, self._state),
            name="pinfeed-prefetch",
            daemon=True,
        )
        self._thread.start()
        _live_prefetchers.add(self)

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        kind, payload = self._state.queue.get()
        if kind == "item":
            return _map_tree(payload, _materialize_staged, lambda x: isinstance(x, _Staged))
        self._done = True
        self.close()
        if kind == "error":
            raise payload
        raise StopIteration

    def close(self, timeout: float = 5.0) -> None:
        """Stops the background thread (after the item it is on) and frees what it staged."""
        self._done = True
        state = self._state
        state.stop.set()
        while True:
            try:
                state.queue.get_nowait()
            except queue.Empty:
                break
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close(timeout=0.5)
        except Exception:
            pass


def prefetch(
    iterable: Iterable[Any],
    device: Any = "cuda",
    depth: int = 2,
    pinned_budget: Any = None,
    *,
    num_threads: Optional[int] = None,
) -> Prefetcher:
    """Moves the batches of any iterable to ``device``, ``depth`` batches ahead.

    Each item may be a numpy array, a torch CPU tensor, or a (nested) tuple, list or dict of
    them, of any sizes; other leaves pass through unchanged. Array leaves are copied through one
    shared pinned arena of ``pinned_budget`` bytes (no page-locked allocation per batch) by a
    background thread, and come out as torch tensors on CUDA (numpy arrays with ``device="cpu"``)
    in the same structure. An exception raised by the iterable is raised by ``next()``; breaking
    out of the loop (or ``close()``) stops the thread.
    """
    return Prefetcher(iterable, device, depth, pinned_budget, num_threads)


def to_device(x: Any, device: Any = "cuda", pinned_budget: Any = None) -> Any:
    """Copies one array (numpy, torch CPU tensor, or anything ``numpy.asarray`` takes) to
    ``device`` through a pinned staging arena of at most ``pinned_budget`` bytes, without pinning
    the array itself; returns a torch tensor on CUDA (a numpy array with ``device="cpu"``) of
    the same shape and dtype, once it has arrived."""

    stager = _shared_stager(device, pinned_budget)
    return _materialize_staged(_upload_leaf(x, stager.upload))


# One staging arena per (device, budget), made on first use and kept: page-locking an arena
# costs far more than a copy through it (see docs/BENCHMARKS.md), so to_device pays it once.
# The arena is bounded by its budget; free_staging_memory() releases them all.
_stagers: Dict[Tuple[str, str], Any] = {}
_stagers_lock = threading.Lock()


def _shared_stager(device: Any, pinned_budget: Any) -> Any:
    key = (device_name(device), repr(pinned_budget))
    with _stagers_lock:
        stager = _stagers.get(key)
        if stager is None:
            stager = _pinfeed.Stager(key[0], pinned_budget, None)
            _stagers[key] = stager
        return stager


def free_staging_memory() -> None:
    """Releases the pinned arenas that :func:`to_device` keeps between calls (their copies are
    waited for first)."""
    with _stagers_lock:
        _stagers.clear()


# A forked child must not use its parent's arenas (their CUDA state does not survive fork).
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_stagers.clear)


@contextlib.contextmanager
def pinned(x: Any, device: Any = "cuda") -> Iterator[Any]:
    """Page-locks a numpy array or torch CPU tensor in place for the ``with`` block
    (``cuMemHostRegister``; ``mlock`` with ``device="cpu"``), so that copies from it run at
    pinned speed, and unlocks it on exit. Copies from it must have finished before the block
    ends."""
    arr, _ = host_array(x)
    if is_torch_tensor(x) and not x.is_contiguous():
        raise ValueError("pinned() needs a contiguous tensor: it locks the memory in place")
    if isinstance(x, np.ndarray) and arr is not x and not np.shares_memory(arr, x):
        raise ValueError("pinned() needs a C-contiguous array: it locks the memory in place")
    region = _pinfeed.PinnedRegion(arr, device_name(device))
    try:
        yield x
    finally:
        region.close()
