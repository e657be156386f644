"""prefetch, to_device and pinned on the host backend."""

import collections
import signal
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest

import pinfeed


def batches(n, rng=None):
    rng = rng or np.random.default_rng(0)
    for i in range(n):
        yield {
            "x": rng.random((i * 7 + 1, 3)).astype(np.float32),
            "y": (
                rng.integers(0, 10, size=i + 2),
                [rng.integers(0, 255, size=(i, 2), dtype=np.uint8), "label"],
            ),
            "meta": {"i": i, "empty": np.zeros((0, 4), np.int16)},
            "scalar": np.float64(i),
        }


def prefetch_threads(before):
    """The prefetch threads started since ``before`` (a set of threads) that are still alive."""
    return [
        t
        for t in threading.enumerate()
        if t not in before and t.name.startswith("pinfeed-prefetch")
    ]


def assert_same_tree(got, want):
    if isinstance(want, dict):
        assert type(got) is type(want) and got.keys() == want.keys()
        for k in want:
            assert_same_tree(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_tree(g, w)
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    else:
        assert got is want or got == want


def test_prefetch_nested_structures():
    want = list(batches(12))
    got = list(pinfeed.prefetch(batches(12), device="cpu", prefetch=3, pinned_budget="64KiB"))
    assert len(got) == 12
    for g, w in zip(got, want):
        assert_same_tree(g, w)


def test_prefetch_arrays_larger_than_the_budget():
    big = [np.arange(i * 100_000, dtype=np.int64) for i in range(1, 5)]
    got = list(pinfeed.prefetch(iter(big), device="cpu", pinned_budget=64 << 10))
    for g, w in zip(got, big):
        np.testing.assert_array_equal(g, w)


def test_prefetch_structured_and_noncontiguous():
    dt = np.dtype([("a", "<f4"), ("b", "u1", (2,))])
    s = np.zeros(5, dtype=dt)
    s["a"] = np.arange(5)
    nc = np.arange(100).reshape(10, 10)[:, ::3]
    [got] = list(pinfeed.prefetch([(s, nc)], device="cpu"))
    assert got[0].dtype == dt
    assert got[0].tobytes() == s.tobytes()
    np.testing.assert_array_equal(got[1], nc)


def test_prefetch_reraises_iterable_errors():
    def gen():
        yield np.zeros(3)
        yield np.ones(3)
        raise ZeroDivisionError("from the iterable")

    it = pinfeed.prefetch(gen(), device="cpu")
    np.testing.assert_array_equal(next(it), np.zeros(3))
    np.testing.assert_array_equal(next(it), np.ones(3))
    with pytest.raises(ZeroDivisionError, match="from the iterable"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_prefetch_early_break_stops_the_thread():
    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield np.full(1000, i)
            i += 1

    before = set(threading.enumerate())
    p = pinfeed.prefetch(endless(), device="cpu", prefetch=2)
    for i, x in enumerate(p):
        assert x[0] == i
        if i == 5:
            break
    p.close()
    n = len(produced)
    time.sleep(0.2)
    assert len(produced) == n, "the fetch thread kept pulling after close()"
    # Six consumed, depth 2 queued, and at most three more held by the two threads.
    assert n <= 6 + 2 + 3
    assert not prefetch_threads(before)


def test_prefetch_dropped_without_close():
    def endless():
        while True:
            yield np.zeros(10)

    p = pinfeed.prefetch(endless(), device="cpu")
    next(p)
    threads = p._threads
    del p
    import gc

    gc.collect()
    for thread in threads:
        thread.join(5)
        assert not thread.is_alive()


def test_prefetch_context_manager_and_empty():
    with pinfeed.prefetch([], device="cpu") as p:
        assert list(p) == []


Point = collections.namedtuple("Point", "i a")


def varied_items(n, seed):
    """Items of many sizes (up to five times a 64 KiB arena) and shapes, each tagged with its index."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        a = np.full(int(rng.integers(0, 40_000)), i, dtype=np.int64)
        kind = i % 4
        if kind == 0:
            yield a
        elif kind == 1:
            yield (i, a[: len(a) // 2].astype(np.float32), [a[:3].copy(), {"k": a[::2]}])
        elif kind == 2:
            yield {"i": i, "x": a.reshape(-1, 1), "nested": (a[:7], "s", {"e": a[:0]})}
        else:
            yield [np.int32(i), Point(i, a.astype(np.uint8)), np.array(i)]


@pytest.mark.parametrize("depth", [1, 4])
def test_prefetch_keeps_order_over_many_varied_items(depth):
    got = list(
        pinfeed.prefetch(
            varied_items(300, seed=depth), device="cpu", prefetch=depth, pinned_budget="64KiB"
        )
    )
    want = list(varied_items(300, seed=depth))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same_tree(g, w)


@pytest.mark.parametrize("where", ["iterable", "upload"])
def test_prefetch_error_mid_stream_comes_after_exactly_the_items_before_it(where):
    asked = []

    def items():
        for i in range(100):
            asked.append(i)
            if i == 37:
                if where == "iterable":
                    raise ZeroDivisionError("item 37")
                yield {"bad": np.array([object()])}  # object arrays cannot be uploaded
                continue
            yield {"i": np.full(i + 1, i)}

    before = set(threading.enumerate())
    got = []
    expected = ZeroDivisionError if where == "iterable" else pinfeed.PinfeedValueError
    p = pinfeed.prefetch(items(), device="cpu", prefetch=3)
    with pytest.raises(expected):
        for x in p:
            got.append(x)
    assert [int(x["i"][0]) for x in got] == list(range(37))
    assert all(len(x["i"]) == i + 1 for i, x in enumerate(got))
    with pytest.raises(StopIteration):
        next(p)
    assert not prefetch_threads(before), "the threads outlived the error"
    assert len(asked) <= 37 + 1 + 3, "the iterable ran on after the error"


def test_prefetch_close_mid_stream_joins_both_threads():
    def endless():
        i = 0
        while True:
            yield (np.full(5000, i), {"i": i})
            i += 1

    before = set(threading.enumerate())
    p = pinfeed.prefetch(endless(), device="cpu", prefetch=3)
    for i in range(4):
        x, meta = next(p)
        assert x[0] == i and meta == {"i": i}
    names = sorted(t.name for t in prefetch_threads(before))
    assert names == ["pinfeed-prefetch-fetch", "pinfeed-prefetch-upload"]
    p.close()
    assert not prefetch_threads(before)
    with pytest.raises(StopIteration):
        next(p)


def test_prefetch_close_abandons_an_iterable_that_blocks_forever():
    release = threading.Event()

    def stuck():
        yield np.zeros(3)
        release.wait()  # forever, as far as close() knows
        yield np.ones(3)

    before = set(threading.enumerate())
    p = pinfeed.prefetch(stuck(), device="cpu")
    np.testing.assert_array_equal(next(p), np.zeros(3))
    closer = threading.Thread(target=p.close, kwargs={"timeout": 1.0}, daemon=True)
    try:
        closer.start()
        closer.join(30)
        assert not closer.is_alive(), "close() hung on an iterable that blocks"
        # The upload thread is gone; the fetch thread is left inside the iterable.
        [fetch] = prefetch_threads(before)
        assert fetch.name == "pinfeed-prefetch-fetch"
        with pytest.raises(StopIteration):
            next(p)
    finally:
        release.set()
    # Once the iterable returns, the fetch thread sees it was stopped and ends.
    fetch.join(30)
    assert not fetch.is_alive()


def test_prefetch_fetches_the_next_item_while_uploading_this_one(monkeypatch):
    from pinfeed import staging

    n = 4
    asked = [threading.Event() for _ in range(n + 1)]
    fetched_on, uploaded_on, overlapped = set(), set(), []

    def items():
        for i in range(n):
            asked[i].set()
            fetched_on.add(threading.current_thread().name)
            yield np.full(4, i)
        asked[n].set()

    real_upload_leaf = staging._upload_leaf

    def upload_leaf(x, upload):
        i = int(x[0])
        uploaded_on.add(threading.current_thread().name)
        # Only a fetch thread of its own can be asked for item i + 1 while item i is being
        # uploaded; one thread doing both would wait here for the whole timeout.
        overlapped.append(asked[i + 1].wait(10))
        return real_upload_leaf(x, upload)

    monkeypatch.setattr(staging, "_upload_leaf", upload_leaf)
    got = list(pinfeed.prefetch(items(), device="cpu", prefetch=1))
    assert [int(x[0]) for x in got] == list(range(n))
    assert overlapped == [True] * n
    assert fetched_on == {"pinfeed-prefetch-fetch"} and uploaded_on == {"pinfeed-prefetch-upload"}


INTERRUPTED = """
import os, signal, threading
import numpy as np
import pinfeed

def items(block):
    i = 0
    while True:
        yield np.full(1000, i)
        i += 1
        if block:
            threading.Event().wait()  # never returns

p = pinfeed.prefetch(items({block}), device="cpu")
next(p)
if {block}:
    print("ready", flush=True)
    next(p)  # blocks until SIGINT
for x in p:
    raise KeyboardInterrupt
"""


@pytest.mark.skipif(
    not hasattr(signal, "SIGINT") or sys.platform == "win32", reason="needs POSIX signals"
)
@pytest.mark.parametrize("block", [True, False], ids=["sigint-while-waiting", "raised-in-the-loop"])
def test_prefetch_keyboard_interrupt_in_the_consumer_exits(block):
    proc = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED.format(block=block)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # Ctrl-C's default in the child, also where the test runner was started with SIGINT
        # ignored (a shell's background job), which a child would inherit.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        if block:
            assert proc.stdout.readline() == b"ready\n"
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate()
    finally:
        watchdog.cancel()
    assert proc.returncode != -signal.SIGKILL, "the interrupted process hung"
    assert b"KeyboardInterrupt" in err, err.decode(errors="replace")


def test_to_device_cpu():
    for x in [
        np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        np.arange(5, dtype=np.int8),
        np.array(3.5),
        np.zeros((0, 3)),
        np.array([True, False]),
        np.arange(10, dtype=np.complex64),
        [[1, 2], [3, 4]],
    ]:
        want = np.asarray(x)
        got = pinfeed.to_device(x, device="cpu", pinned_budget="16KiB")
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_to_device_large_through_small_budget():
    x = np.random.default_rng(3).random(1_000_000)
    np.testing.assert_array_equal(pinfeed.to_device(x, device="cpu", pinned_budget="64KiB"), x)


@pytest.mark.parametrize("method", ["both", "stage", "register"])
def test_to_device_methods_deliver_every_byte(method):
    from pinfeed import _pinfeed

    rng = np.random.default_rng(7)
    backing = rng.integers(0, 256, size=(40 << 20) + 12345, dtype=np.uint8)
    stager = _pinfeed.Stager("cpu", "16MiB", 2, method)
    assert stager.method == method and stager.pinned_budget == 16 << 20
    for start, n in [(0, 40 << 20), (3, (20 << 20) + 5), (4095, 10 << 20), (1, 100)]:
        x = backing[start : start + n]
        got = np.from_dlpack(stager.upload(x, (1, 8, 1), [n]))
        assert zlib.crc32(got) == zlib.crc32(x), (method, start, n)
    c = stager.counters()
    assert c["staged_bytes"] + c["registered_bytes"] == (70 << 20) + 105
    assert (c["registered_bytes"] > 0) == (method != "stage"), c
    assert c["direct_bytes"] == 0 and c["register_error"] is None
    got = pinfeed.to_device(backing, device="cpu", pinned_budget="16MiB", method=method)
    np.testing.assert_array_equal(got, backing)


def test_to_device_refuses_an_unknown_method():
    with pytest.raises(ValueError, match="expected both, stage or register"):
        pinfeed.to_device(np.zeros(3), device="cpu", method="fast")


def test_pinned_cpu():
    x = np.arange(1024, dtype=np.float32)
    with pinfeed.pinned(x, device="cpu") as y:
        assert y is x
        np.testing.assert_array_equal(pinfeed.to_device(y, device="cpu"), x)


def test_pinned_rejects_views_it_cannot_lock_in_place():
    with pytest.raises(ValueError):
        with pinfeed.pinned(np.zeros((10, 10))[:, ::2], device="cpu"):
            pass


def test_device_buffer_exports_once():
    from pinfeed import _pinfeed

    stager = _pinfeed.Stager("cpu", 1 << 16)
    a = np.arange(10, dtype=np.int32)
    buf = stager.upload(a, (0, 32, 1), [10])
    assert buf.__dlpack_device__() == (1, 0)
    assert buf.shape == [10] and buf.nbytes == 40 and not buf.exported
    assert bytes(buf.read_back()) == a.tobytes()
    np.testing.assert_array_equal(np.from_dlpack(buf), a)
    assert buf.exported
    with pytest.raises(BufferError):
        buf.__dlpack__()


def test_device_buffer_capsules():
    from pinfeed import _pinfeed

    stager = _pinfeed.Stager("cpu", 1 << 16)
    a = np.arange(6, dtype=np.float64)
    legacy = stager.upload(a, (2, 64, 1), [2, 3]).__dlpack__()
    assert "dltensor" in repr(legacy) and "versioned" not in repr(legacy)
    del legacy  # an unconsumed capsule frees its buffer
    versioned = stager.upload(a, (2, 64, 1), [2, 3]).__dlpack__(max_version=(1, 0), copy=True)
    assert "dltensor_versioned" in repr(versioned)
    del versioned
    with pytest.raises(BufferError):
        stager.upload(a, (2, 64, 1), [6]).__dlpack__(dl_device=(2, 0))
    with pytest.raises(pinfeed.PinfeedValueError, match="cover"):
        stager.upload(a, (2, 64, 1), [7])


def test_dlpack_dtypes():
    from pinfeed import _pinfeed

    assert _pinfeed.dlpack_dtype("'|b1'") == (6, 8, 1)
    assert _pinfeed.dlpack_dtype("'<i4'") == (0, 32, 1)
    assert _pinfeed.dlpack_dtype("'|u1'") == (1, 8, 1)
    assert _pinfeed.dlpack_dtype("'<f2'") == (2, 16, 1)
    assert _pinfeed.dlpack_dtype("'<c16'") == (5, 128, 1)
    assert _pinfeed.dlpack_dtype("'<M8[ns]'") is None
    assert _pinfeed.dlpack_dtype("[('a', '<f4')]") is None


def test_batches_from_the_loader_are_device_buffers_until_exported():
    from pinfeed import _pinfeed

    data = np.arange(100, dtype=np.uint8).reshape(25, 4)
    source = _pinfeed.Source.from_array(data, "'|u1'")
    options = _pinfeed.StreamOptions(
        source, 10, export_dtype=(1, 8, 1), record_shape=[4], device="cpu"
    )
    stream = _pinfeed.Stream(options)
    bufs = list(stream)
    assert [b.index for b in bufs] == [0, 1, 2] and [b.first_record for b in bufs] == [0, 10, 20]
    assert bufs[2].shape == [5, 4]
    assert stream.stats()["device_bytes_held"] == 100
    for b in bufs:
        b.release()
    assert stream.closed


def test_to_device_keeps_one_arena_per_budget_however_it_is_written():
    from pinfeed import staging

    staging.free_staging_memory()
    x = np.arange(10, dtype=np.float32)
    for budget in ("64KiB", 64 << 10, "64kib"):
        np.testing.assert_array_equal(pinfeed.to_device(x, device="cpu", pinned_budget=budget), x)
    assert len(staging._stagers) == 1
    staging.free_staging_memory()


def test_prefetch_stats_count_what_was_uploaded_and_name_a_slow_iterable():
    items = [np.full((1000 + i, 8), i, dtype=np.float32) for i in range(20)]

    def slow():
        for x in items:
            time.sleep(0.01)
            yield {"x": x, "label": "text"}

    p = pinfeed.prefetch(slow(), device="cpu", prefetch=2)
    got = list(p)
    s = p.stats()
    assert len(got) == s["items"] == 20
    assert s["bytes"] == sum(x.nbytes for x in items)
    assert s["fetch_s"] >= 20 * 0.01 and s["fetch_s"] > s["upload_s"]
    assert s["consumer_wait_s"] > 0.1 * s["elapsed_s"]
    assert s["bottleneck"].startswith("the iterable")
    assert 0 < s["gbps"] < s["bytes"] / 1e9 / (20 * 0.01)


def test_prefetch_stats_name_a_slow_consumer():
    p = pinfeed.prefetch((np.zeros(256, np.uint8) for _ in range(20)), device="cpu", prefetch=2)
    for _ in p:
        time.sleep(0.01)
    s = p.stats()
    assert s["items"] == 20 and s["bytes"] == 20 * 256
    assert s["consumer_wait_s"] < 0.1 * s["elapsed_s"]
    assert s["bottleneck"].startswith("the consumer")
    # The threads waited for the consumer to make room.
    assert s["upload_wait_s"] + s["fetch_wait_s"] > 0.1


def test_prefetch_stats_before_any_item():
    p = pinfeed.prefetch(iter([]), device="cpu")
    assert p.stats()["bottleneck"] in ("nothing delivered yet",)
    assert list(p) == [] and p.stats()["items"] == 0
