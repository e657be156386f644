"""``prefetch``, ``to_device`` and ``pinned``: moving arbitrary arrays without per-batch pinning."""

import atexit
import contextlib
import copy
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Optional

import numpy as np

from . import _pinfeed
from ._arrays import BFLOAT16, export_for, host_array, is_torch_tensor
from ._deprecation import accepts_old_spellings, positional_to_keywords
from ._frameworks import check_device, check_dtype, deliver, framework_arg
from ._options import device_name, int_arg, warn_if_host_fallback
from .errors import PinfeedError, PinfeedTypeError, PinfeedValueError

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


def _checked_upload(upload, framework: Optional[str], what: str):
    """``upload`` (a ``Stager.upload``), refusing first an array the framework would change
    on the way in (``_frameworks.check_dtype``)."""
    if framework != "jax":
        return upload

    def checked(arr: np.ndarray, dl_dtype: Any, shape: Any) -> Any:
        if tuple(dl_dtype) != BFLOAT16 and arr.dtype.fields is None:
            check_dtype(framework, arr.dtype, what)
        return upload(arr, dl_dtype, shape)

    return checked


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


def _materialize_staged(s: _Staged, framework: Optional[str] = None) -> Any:
    return deliver(s.buf, s.view, framework)


# How many fetched, not yet uploaded items may wait between the two threads. One is enough for
# fetching to overlap uploading; more would only hold more host batches.
_FETCH_AHEAD = 1
# How often a thread waiting on a queue looks at the stop event.
_POLL_S = 0.05


class _Times:
    """Where a prefetch pipeline's time goes, in seconds per stage: what :meth:`Prefetcher.stats`
    reports. Each field is written by one thread only; a float store is atomic under the GIL."""

    # The upload thread's waits, apart: for a fetched item (starved) and for room (blocked).
    FIELDS = ("fetch_s", "fetch_wait_s", "upload_s", "upload_starved_s", "upload_blocked_s")
    FIELDS += ("consumer_wait_s",)

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.items = 0
        self.bytes = 0
        for f in self.FIELDS:
            setattr(self, f, 0.0)

    def add(self, field: str, seconds: float) -> None:
        setattr(self, field, getattr(self, field) + seconds)

    def report(self) -> dict[str, Any]:
        """The counters, the rate, and the stage that limits it, in words."""
        elapsed = time.perf_counter() - self.started
        r: dict[str, Any] = {f: getattr(self, f) for f in self.FIELDS}
        r["upload_wait_s"] = self.upload_starved_s + self.upload_blocked_s
        r.update(items=self.items, bytes=self.bytes, elapsed_s=elapsed)
        r["gbps"] = self.bytes / elapsed / 1e9 if elapsed > 0 else 0.0
        # The loader's rule and its wording (pinfeed::StageTimes): the iterable is the producer,
        # the upload thread the copy stage.
        _, r["bottleneck"] = _pinfeed.bottleneck(
            elapsed=elapsed,
            delivered=self.items,
            consumer_wait=self.consumer_wait_s,
            copy_starved=self.upload_starved_s,
            copy_blocked=self.upload_blocked_s,
            producer="the iterable",
            copier="the upload",
        )
        return r


class _State:
    """What the two threads and the consumer share (never the Prefetcher itself, so that dropping
    the Prefetcher stops the threads).

    ``fetched`` carries raw items from the fetch thread to the upload thread, ``staged`` uploaded
    ones to the consumer. A message is ``("item", x)``, ``("error", exc)`` or ``("end", None)``;
    an error or the end is the last message on its queue.
    """

    def __init__(self, depth: int) -> None:
        self.fetched: queue.Queue[Any] = queue.Queue(maxsize=_FETCH_AHEAD)
        self.staged: queue.Queue[Any] = queue.Queue(maxsize=depth)
        # Set by close(), or by the upload thread once the last message is handed over: a thread
        # waiting on a queue that nobody will empty (or fill) then gives up.
        self.stop = threading.Event()
        self.times = _Times()

    def put(self, q: "queue.Queue[Any]", message: tuple[str, Any], waited: str) -> bool:
        """Puts ``message`` on ``q`` once there is room, adding the wait to ``times.<waited>``;
        False, dropping it, once stopped."""
        t0 = time.perf_counter()
        try:
            while not self.stop.is_set():
                try:
                    q.put(message, timeout=_POLL_S)
                    return True
                except queue.Full:
                    continue
            return False
        finally:
            self.times.add(waited, time.perf_counter() - t0)

    def get(self, q: "queue.Queue[Any]", waited: str) -> Optional[tuple[str, Any]]:
        """The next message on ``q``, adding the wait to ``times.<waited>``; None once stopped."""
        t0 = time.perf_counter()
        try:
            while not self.stop.is_set():
                try:
                    return q.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
            return None
        finally:
            self.times.add(waited, time.perf_counter() - t0)

    def drain(self) -> None:
        """Drops what is queued (uploaded items give back their device memory)."""
        for q in (self.fetched, self.staged):
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break


def _stateful(iterable: Any) -> Optional[Any]:
    """``iterable`` when it follows the Stateful protocol (torchdata's ``StatefulDataLoader``,
    a pinfeed Loader: ``state_dict`` and ``load_state_dict``), else None."""
    if callable(getattr(iterable, "state_dict", None)) and callable(
        getattr(iterable, "load_state_dict", None)
    ):
        return iterable
    return None


def _fetch(it: Iterator[Any], state: _State, stateful: Optional[Any]) -> None:
    """The fetch thread: runs the iterable, which may hold the GIL, or block, for a long time.
    An item travels with the iterable's state right after it was fetched (a copy), so the
    consumer can report the state of the items it received, not of those read ahead."""
    try:
        while not state.stop.is_set():
            t0 = time.perf_counter()
            try:
                item = next(it)
                snapshot = None if stateful is None else copy.deepcopy(stateful.state_dict())
            except StopIteration:
                state.put(state.fetched, ("end", None), "fetch_wait_s")
                return
            finally:
                state.times.add("fetch_s", time.perf_counter() - t0)
            if not state.put(state.fetched, ("item", (item, snapshot)), "fetch_wait_s"):
                return
            del item  # not kept alive while the next one is fetched
    except BaseException as e:  # re-raised in the consumer, after the items before it
        state.put(state.fetched, ("error", e), "fetch_wait_s")


def _upload(stager: "_pinfeed.Stager", state: _State, framework: Optional[str]) -> None:
    """The upload thread: copies each fetched item's array leaves through the pinned arena
    (``Stager.upload`` releases the GIL, so the fetch thread runs meanwhile)."""

    times = state.times
    upload = _checked_upload(stager.upload, framework, "prefetch")

    def upload_leaf(x: Any) -> _Staged:
        staged = _upload_leaf(x, upload)
        times.bytes += staged.buf.nbytes
        return staged

    while True:
        message = state.get(state.fetched, "upload_starved_s")
        if message is None:
            return
        if message[0] == "item":
            t0 = time.perf_counter()
            try:
                tree, snapshot = message[1]
                message = ("item", (_map_tree(tree, upload_leaf, _is_array_leaf), snapshot))
                times.items += 1
            except BaseException as e:  # re-raised in the consumer, after the items before it
                message = ("error", e)
            times.add("upload_s", time.perf_counter() - t0)
        if not state.put(state.staged, message, "upload_blocked_s"):
            return
        if message[0] != "item":
            # Nothing after the end or an error is wanted: let the fetch thread go too.
            state.stop.set()
            return
        del message  # not kept alive while the next one is awaited


class Prefetcher(Iterator[Any]):
    """Iterator returned by :func:`prefetch`; ``close()`` (or dropping it) stops its threads.

    Over a stateful iterable (torchdata's ``StatefulDataLoader``, a pinfeed Loader: anything
    with ``state_dict`` and ``load_state_dict``), the Prefetcher follows the same protocol:
    :meth:`state_dict` is the iterable's state as of the last item the consumer received (the
    items read ahead are not counted), and :meth:`load_state_dict` restarts the pipeline from
    a saved state."""

    @accepts_old_spellings(
        "Prefetcher",
        positional_to_keywords(
            "Prefetcher",
            ("device", "depth", "pinned_budget", "num_threads", "framework"),
            2,
            ("device", "prefetch", "pinned_budget", "num_threads", "framework"),
        ),
    )
    def __init__(
        self,
        source: Iterable[Any],
        *,
        device: Any = "auto",
        framework: Optional[str] = None,
        pinned_budget: Any = None,
        num_threads: Optional[int] = None,
        prefetch: int = 2,
    ) -> None:
        depth = int_arg("prefetch", "prefetch", prefetch)
        iterable = source
        framework = framework_arg(framework)
        self._stager = _pinfeed.Stager(device_name(device), pinned_budget, num_threads)
        self.device: str = self._stager.device
        warn_if_host_fallback(device_name(device), self.device)
        check_device(framework, self.device, "prefetch")
        #: What items' arrays are delivered as (see :func:`prefetch`).
        self.framework: Optional[str] = framework
        self._iterable = iterable
        self._depth = depth
        self._pid = os.getpid()
        self._start()
        _live_prefetchers.add(self)

    def _start(self) -> None:
        """Starts the two threads on a new iterator of the iterable, with the iterable's state
        now as the state of what the consumer has received."""
        stateful = _stateful(self._iterable)
        self._received_state = None if stateful is None else copy.deepcopy(stateful.state_dict())
        self._state = _State(self._depth)
        self._done = False
        # The upload thread first: close() joins in this order, and only the fetch thread can be
        # stuck in user code.
        self._threads = (
            threading.Thread(
                target=_upload,
                args=(self._stager, self._state, self.framework),
                name="pinfeed-prefetch-upload",
                daemon=True,
            ),
            threading.Thread(
                target=_fetch,
                args=(iter(self._iterable), self._state, stateful),
                name="pinfeed-prefetch-fetch",
                daemon=True,
            ),
        )
        for t in self._threads:
            t.start()

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if os.getpid() != self._pid:
            # Its threads did not survive the fork: waiting on them would hang.
            raise PinfeedError(
                f"this prefetch iterator was made in process {self._pid} and cannot be used in "
                f"forked child {os.getpid()} (its threads and CUDA state do not survive fork); "
                "call pinfeed.prefetch in the child"
            )
        t0 = time.perf_counter()
        kind, payload = self._state.staged.get()
        self._state.times.add("consumer_wait_s", time.perf_counter() - t0)
        if kind == "item":
            tree, self._received_state = payload
            framework = self.framework
            return _map_tree(
                tree, lambda s: _materialize_staged(s, framework), lambda x: isinstance(x, _Staged)
            )
        self._done = True
        self.close()
        if kind == "error":
            raise payload
        raise StopIteration

    def state_dict(self) -> Any:
        """The iterable's ``state_dict()`` as of the last item this iterator returned (before
        the first, as of when the pipeline started): resuming the iterable from it delivers
        exactly the items the consumer has not received. Raises
        :class:`pinfeed.PinfeedTypeError` when the
        iterable has no ``state_dict``/``load_state_dict``."""
        self._require_stateful("state_dict")
        return copy.deepcopy(self._received_state)

    def load_state_dict(self, state: Any) -> None:
        """Stops the pipeline, drops what it read ahead, loads ``state`` into the iterable
        (``iterable.load_state_dict(state)``) and starts again on a new iterator of it: the
        next item is the one after ``state``'s."""
        stateful = self._require_stateful("load_state_dict")
        self.close()
        stateful.load_state_dict(state)
        self._start()

    def _require_stateful(self, what: str) -> Any:
        stateful = _stateful(self._iterable)
        if stateful is None:
            raise PinfeedTypeError(
                f"Prefetcher.{what}: the iterable ({type(self._iterable).__name__}) has no "
                "state_dict/load_state_dict (a torchdata StatefulDataLoader or a pinfeed Loader "
                "has)"
            )
        return stateful

    def stats(self) -> dict[str, Any]:
        """Where the time went so far, in seconds: ``fetch_s`` inside the iterable's
        ``__next__``, ``upload_s`` copying into the arena and starting the transfers,
        ``fetch_wait_s``/``upload_wait_s`` those threads waiting on each other (or on a full
        queue), ``consumer_wait_s`` the caller's ``next()`` waiting for an uploaded item; with
        ``items``, ``bytes`` (array bytes uploaded), ``elapsed_s``, ``gbps`` and ``bottleneck``,
        the stage that sets the pace, in words."""
        return self._state.times.report()

    def close(self, timeout: float = 5.0) -> None:
        """Stops both threads (each after the item it is on), waiting ``timeout`` seconds in all,
        and frees what they staged. A fetch thread stuck inside the iterable is left behind (it
        is a daemon thread) and ends as soon as the iterable returns."""
        self._done = True
        if os.getpid() != self._pid:
            return  # a forked child: the threads exist only in the parent
        state = self._state
        state.stop.set()
        state.drain()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            # The last reference can be dropped (and close() run by __del__) on either thread.
            if t.is_alive() and t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        # A put that was already under way when stop was set may have landed after the drain.
        state.drain()

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close(timeout=0.5)
        except Exception:
            pass


@accepts_old_spellings(
    "prefetch",
    positional_to_keywords(
        "prefetch", ("device", "depth", "pinned_budget"), 1, ("device", "prefetch", "pinned_budget")
    ),
)
def prefetch(
    source: Iterable[Any],
    *,
    device: Any = "auto",
    framework: Optional[str] = None,
    pinned_budget: Any = None,
    num_threads: Optional[int] = None,
    prefetch: int = 2,
) -> Prefetcher:
    """Moves the batches of any iterable (``source``) to ``device``, ``prefetch`` batches
    ahead.

    Each item may be a numpy array, a torch CPU tensor, or a (nested) tuple, list or dict of
    them, of any sizes; other leaves pass through unchanged. They come out as torch tensors on
    CUDA (numpy arrays with ``device="cpu"``) in the same structure and order.

    What runs where: two daemon threads form a pipeline, so that fetching one item overlaps
    uploading the one before it (as DataLoader's pin-memory thread does for pinning).

    - The fetch thread (``pinfeed-prefetch-fetch``) runs the iterable's ``__next__``, e.g. a
      DataLoader's collation or its hand-over from worker processes, and passes each raw item
      to the upload thread over a queue of one item.
    - The upload thread (``pinfeed-prefetch-upload``) copies the item's array leaves through one
      shared pinned arena of ``pinned_budget`` bytes (default 64 MiB; no page-locked allocation per batch; the
      copy uses ``num_threads`` threads and releases the GIL), starts their transfer to
      ``device``, and queues the result: ``prefetch`` items at most, and one more waiting for
      room.
    - ``next()``, in the caller's thread, takes the next uploaded item and wraps its buffers.

    So on the host at most three raw items are held (one being fetched, one queued, one being
    uploaded) and the iterable runs at most ``prefetch + 3`` items ahead of the consumer.

    An exception raised by the iterable, or while uploading, is raised by ``next()`` after the
    items before it, and then ``StopIteration``. Breaking out of the loop, ``close()`` or
    dropping the iterator stops both threads and frees what they uploaded; a fetch thread
    blocked inside the iterable is left behind and ends when the iterable returns.
    """
    return Prefetcher(
        source,
        device=device,
        framework=framework,
        pinned_budget=pinned_budget,
        num_threads=num_threads,
        prefetch=prefetch,
    )


@accepts_old_spellings(
    "to_device",
    positional_to_keywords(
        "to_device", ("device", "pinned_budget"), 1, ("device", "pinned_budget")
    ),
)
def to_device(
    source: Any,
    *,
    device: Any = "auto",
    framework: Optional[str] = None,
    pinned_budget: Any = None,
    method: str = "stage",
) -> Any:
    """Copies one array (``source``: numpy, torch CPU tensor, or anything ``numpy.asarray`` takes) to
    ``device`` without pinning the array for good, with at most ``pinned_budget`` bytes
    page-locked at once (default 64 MiB: an arena that stays in the CPU's cache is faster than a
    larger one, see docs/BENCHMARKS.md); returns a torch tensor on CUDA (a numpy array with ``device="cpu"``) of
    the same shape and dtype. When it returns, the array may be changed: nothing reads it any
    more.

    ``method``: ``"stage"`` (default, the fastest on the H200 machine) copies the array through
    a pinned arena with several CPU threads; ``"register"`` page-locks the array in place chunk
    by chunk and lets the copy engine read it directly (little CPU time, bounded by the driver's
    registration rate); ``"both"`` runs the two at once from opposite ends, each with half the
    budget. An array that is page-locked already (``pin_memory()``, :func:`pinned`) is copied
    straight from, whatever the method. ``framework`` picks the kind of array returned, as for
    :class:`pinfeed.Loader`."""

    framework = framework_arg(framework)
    stager = _shared_stager(device, pinned_budget, method)
    check_device(framework, stager.device, "to_device")
    upload = _checked_upload(stager.upload, framework, "to_device")
    return _materialize_staged(_upload_leaf(source, upload), framework)


# One staging arena per (device, budget, method), made on first use and kept: page-locking an
# arena costs far more than a copy through it (see docs/BENCHMARKS.md), so to_device pays it
# once. The arena is bounded by its budget; free_staging_memory() releases them all.
_stagers: dict[tuple[str, str, str], Any] = {}
_stagers_lock = threading.Lock()


def _shared_stager(device: Any, pinned_budget: Any, method: str = "stage") -> Any:
    # "64MiB" and 64 << 20 are one arena: the key holds the size in bytes.
    size = _pinfeed.byte_size(pinned_budget, "pinned_budget")
    key = (device_name(device), repr(size), method)
    with _stagers_lock:
        stager = _stagers.get(key)
        if stager is None:
            stager = _pinfeed.Stager(key[0], size, None, method)
            warn_if_host_fallback(key[0], stager.device)
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
        raise PinfeedValueError("pinned() needs a contiguous tensor: it locks the memory in place")
    if isinstance(x, np.ndarray) and arr is not x and not np.shares_memory(arr, x):
        raise PinfeedValueError("pinned() needs a C-contiguous array: it locks the memory in place")
    region = _pinfeed.PinnedRegion(arr, device_name(device))
    try:
        yield x
    finally:
        region.close()
