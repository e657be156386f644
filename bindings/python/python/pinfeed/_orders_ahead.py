"""The epoch orders of a GPU-resident ``Loader`` (``shuffle="gpu"``), computed ahead of need on
worker threads while the current epoch is gathered."""

import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np

from . import _pinfeed
from ._arrays import torch_module

# The order workers of GPU-resident loaders still open: joined at exit by the hook of
# pinfeed._passes, after the loaders' passes, not killed inside Rust.
live_orders: "weakref.WeakSet[OrdersAhead]" = weakref.WeakSet()


def order_filler(device: str, pin: bool) -> Callable[[tuple[Any, ...]], Any]:
    """Computes the order of a key (``Loader._order_key``) into a new int64 buffer: with
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

    Orders are keyed by everything they depend on (``Loader._order_key``), so after
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
