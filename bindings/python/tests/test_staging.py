"""prefetch, to_device and pinned on the host backend."""

import threading
import time

import numpy as np
import pytest

import pinfeed


def batches(n, rng=None):
    rng = rng or np.random.default_rng(0)
    for i in range(n):
        yield {
            "x": rng.random((i * 7 + 1, 3)).astype(np.float32),
            "y": (rng.integers(0, 10, size=i + 2), [rng.integers(0, 255, size=(i, 2), dtype=np.uint8), "label"]),
            "meta": {"i": i, "empty": np.zeros((0, 4), np.int16)},
            "scalar": np.float64(i),
        }


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
    got = list(pinfeed.prefetch(batches(12), device="cpu", depth=3, pinned_budget="64KiB"))
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

    before = {t.ident for t in threading.enumerate()}
    p = pinfeed.prefetch(endless(), device="cpu", depth=2)
    for i, x in enumerate(p):
        assert x[0] == i
        if i == 5:
            break
    p.close()
    n = len(produced)
    time.sleep(0.2)
    assert len(produced) == n, "the worker kept pulling after close()"
    assert n <= 6 + 2 + 2
    leftover = [t for t in threading.enumerate() if t.ident not in before and t.name == "pinfeed-prefetch"]
    assert not leftover


def test_prefetch_dropped_without_close():
    def endless():
        while True:
            yield np.zeros(10)

    p = pinfeed.prefetch(endless(), device="cpu")
    next(p)
    thread = p._thread
    del p
    import gc

    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_prefetch_context_manager_and_empty():
    with pinfeed.prefetch([], device="cpu") as p:
        assert list(p) == []


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
    stream = _pinfeed.Stream(source, 10, export_dtype=(1, 8, 1), record_shape=[4], device="cpu")
    bufs = list(stream)
    assert [b.index for b in bufs] == [0, 1, 2] and [b.first_record for b in bufs] == [0, 10, 20]
    assert bufs[2].shape == [5, 4]
    assert stream.stats()["device_bytes_held"] == 100
    for b in bufs:
        b.release()
    assert stream.closed
