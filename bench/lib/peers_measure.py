"""What the peers harness measures of one loader, in the process that runs it: samples/s to the
device, CPU seconds of the process tree per 1,000 samples, peak RSS of the tree, the first batch's
latency, and a check of the first batches against the source.

The process tree is read from /proc (no psutil here or in CI): a loader's worker processes and
threads count, and so does a worker that exits, once reaped (its time joins its parent's
cutime/cstime). RSS is summed over the tree, sampled every 20 ms: pages shared between a
parent and its forked workers count once in each, so the sum is an upper bound.
"""

import os
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


class Skip(Exception):
    """A peer that cannot run here; its message is the reason, printed in the row."""


def _stat(pid):
    """(ppid, cpu seconds with reaped children, rss bytes) of pid, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields[0] is the state (field 3 of proc(5)); utime..cstime are fields 14-17, rss field 24.
    cpu = sum(int(v) for v in fields[11:15]) / TICK
    return int(fields[1]), cpu, int(fields[21]) * PAGE


def tree(root=None):
    """(cpu seconds, rss bytes) of root (default: this process) and all its descendants."""
    root = root or os.getpid()
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            s = _stat(int(name))
            if s:
                stats[int(name)] = s
    children = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    cpu = rss = 0
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            cpu += stats[pid][1]
            rss += stats[pid][2]
        todo.extend(children.get(pid, ()))
    return cpu, rss


class PeakRss(threading.Thread):
    """Samples the tree's RSS until stopped; `peak` is the largest sum seen."""

    def __init__(self, period=0.02):
        super().__init__(daemon=True)
        self.period, self.peak, self._stop_event = period, 0, threading.Event()
        self.start()

    def run(self):
        while not self._stop_event.wait(self.period):
            self.peak = max(self.peak, tree()[1])

    def stop(self):
        self._stop_event.set()
        self.join()
        self.peak = max(self.peak, tree()[1])
        return self.peak


def to_device(batch, device):
    """The batch's tensors on `device` (non-blocking from pinned memory), numpy arrays as tensors;
    a tuple, list or dict keeps its shape."""
    import numpy as np
    import torch

    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    if isinstance(batch, np.ndarray):
        batch = torch.from_numpy(batch)
    if isinstance(batch, torch.Tensor) and batch.device != torch.device(device):
        return batch.to(device, non_blocking=True)
    return batch


def host_copy(batch):
    """A host copy of a delivered batch, for the check after timing."""
    import numpy as np
    import torch

    if isinstance(batch, dict):
        return {k: host_copy(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(host_copy(v) for v in batch)
    if isinstance(batch, torch.Tensor):
        return batch.detach().cpu().numpy().copy()
    if isinstance(batch, np.ndarray):
        return batch.copy()
    return batch


def sync(device):
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def measure(peer, device, batches, warmup, min_seconds, keep=3):
    """Runs one peer: `peer.batches()` is an iterator of batches, each `peer.samples` samples,
    that `peer.deliver(batch, device)` puts on the device (default: `to_device`). Takes the first
    batch (its latency from the iterator's making), `warmup` more, then times at least `batches`
    and at least `min_seconds`. The first `keep` batches are kept on the host and checked with
    `peer.check(batch)` after timing. Returns the row's measures."""
    deliver = getattr(peer, "deliver", None) or to_device
    rss = PeakRss()
    t0 = time.perf_counter()
    it = peer.batches()
    first = deliver(next(it), device)
    sync(device)
    first_s = time.perf_counter() - t0
    kept = [host_copy(first)]
    for _ in range(warmup):
        b = deliver(next(it), device)
        if len(kept) < keep:
            kept.append(host_copy(b))
    sync(device)
    cpu0, w0 = tree()[0], time.perf_counter()
    taken = 0
    while taken < batches or time.perf_counter() - w0 < min_seconds:
        try:
            deliver(next(it), device)
        except StopIteration:
            break
        taken += 1
    sync(device)
    seconds, cpu = time.perf_counter() - w0, tree()[0] - cpu0
    peak = rss.stop()
    close = getattr(it, "close", None)
    if close:
        close()
    del it
    samples = taken * peer.samples
    if taken == 0:
        raise RuntimeError(f"the loader ran out after {warmup + 1} batches: make the data larger")
    checked = 0
    for b in kept:
        peer.check(b)
        checked += 1
    return {
        "samples_per_s": samples / seconds,
        "cpu_s_per_1k": 1000 * cpu / samples,
        "peak_rss_mib": peak / 2**20,
        "first_batch_s": first_s,
        "timed_batches": taken,
        "timed_s": seconds,
        "checked_batches": checked,
    }


class Peer:
    """One loader made ready: `batches()` makes its iterator, each batch `samples` samples;
    `check(host_batch)` raises on a wrong one; `settings` and `version` go into the row;
    `deliver(batch, device)`, when given, replaces `to_device`."""

    def __init__(self, batches, samples, check, settings, version, deliver=None):
        self.batches, self.samples, self.check = batches, samples, check
        self.settings, self.version, self.deliver = settings, version, deliver


def converted(folder):
    """Whether a peer's writer already converted the data into `folder`."""
    return os.path.exists(os.path.join(folder, ".peers-done"))


def mark_converted(folder):
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, ".peers-done"), "w").close()
