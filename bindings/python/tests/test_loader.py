"""Loader on the host backend: values byte for byte against numpy."""

import os
import warnings

import numpy as np
import pytest

import pinfeed


def collect(loader):
    return list(loader)


@pytest.mark.parametrize("batch_size", [1, 7, 25, 99, 100])
@pytest.mark.parametrize("drop_last", [False, True])
def test_npy_byte_for_byte(tmp_path, batch_size, drop_last):
    data = np.random.default_rng(0).integers(0, 255, size=(100, 3, 5), dtype=np.uint8)
    path = tmp_path / "d.npy"
    np.save(path, data)
    ref = np.load(path)
    loader = pinfeed.Loader(path, batch_size, device="cpu", drop_last=drop_last)
    batches = collect(loader)
    full = 100 // batch_size if drop_last else -(-100 // batch_size)
    assert len(loader) == full == len(batches)
    for i, b in enumerate(batches):
        assert isinstance(b, np.ndarray)
        assert b.dtype == ref.dtype and b.shape[1:] == ref.shape[1:]
        np.testing.assert_array_equal(b, ref[i * batch_size : i * batch_size + len(b)])
        assert len(b) == batch_size or (not drop_last and i == len(batches) - 1)


@pytest.mark.parametrize("piece_size", [None, 1, "100B", 3 * 15 * 4])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_in_pieces_equal_whole_batches(tmp_path, piece_size, shuffle):
    data = np.random.default_rng(5).random((1000, 3, 5)).astype(np.float32)  # 60-byte records
    path = tmp_path / "p.npy"
    np.save(path, data)
    whole = pinfeed.Loader(path, 128, device="cpu", shuffle=shuffle, seed=3, piece_size=None)
    loader = pinfeed.Loader(path, 128, device="cpu", shuffle=shuffle, seed=3, piece_size=piece_size)
    want, got = collect(whole), collect(loader)
    assert len(got) == len(want) == 8
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    if not shuffle:
        np.testing.assert_array_equal(np.concatenate(got), data)
    # A piece of 1 byte still holds one record: 60-byte slots, rounded up to a page.
    assert loader.stats()["slot_bytes"] == (
        4096 if piece_size is not None else 128 * 60 + (4096 - 128 * 60 % 4096)
    )
    assert whole.stats()["slot_claims"] == 8  # whole batches: one slot a batch


def test_stats_count_the_slots_a_reader_got_back_from_itself():
    # One reader, two slots, 20 batches: every claim but the first of each slot is of a slot it
    # filled itself.
    data = np.arange(20 * 64 * 64, dtype=np.uint8).reshape(20 * 64, 64)
    loader = pinfeed.Loader(data, 64, device="cpu", pinned_budget=2 * 4096, num_threads=1)
    np.testing.assert_array_equal(np.concatenate(collect(loader)), data)
    st = loader.stats()
    assert (st["slots"], st["slot_claims"]) == (2, 20), st
    assert 20 - st["slots"] <= st["slot_claims_own"] < 20, st


def test_piece_size_must_be_positive():
    with pytest.raises(pinfeed.PinfeedValueError, match="piece_size"):
        pinfeed.Loader(np.zeros((10, 4), np.uint8), 2, device="cpu", piece_size=0)


@pytest.mark.parametrize(
    "dtype",
    ["<f4", "<f8", "<i2", "<u8", "|b1", "<f2", "<c8", "<c16", "<M8[ns]", "|S5", "<U3"],
)
def test_npy_dtypes(tmp_path, dtype):
    rng = np.random.default_rng(1)
    data = (rng.random((37, 4)) * 100).astype(dtype)
    path = tmp_path / "d.npy"
    np.save(path, data)
    out = np.concatenate(collect(pinfeed.Loader(str(path), 8, device="cpu")))
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, np.load(path))


def test_structured_npy(tmp_path):
    dt = np.dtype(
        [("x", "<f4"), ("pad", "V3"), ("y", "u1", (3,)), ("z", [("a", "<i2"), ("b", "<f8")])]
    )
    data = np.zeros(53, dtype=dt)
    data["x"] = np.arange(53)
    data["y"] = np.arange(53 * 3).reshape(53, 3) % 256
    data["z"]["a"] = -np.arange(53)
    data["z"]["b"] = np.arange(53) / 7
    path = tmp_path / "s.npy"
    np.save(path, data)
    batches = collect(pinfeed.Loader(path, 10, device="cpu"))
    assert [len(b) for b in batches] == [10] * 5 + [3]
    out = np.concatenate(batches)
    assert out.dtype == np.load(path).dtype
    assert out.tobytes() == np.load(path).tobytes()


def test_structured_raw_bytes(tmp_path):
    dt = np.dtype([("x", "<f4"), ("y", "u1", (3,))])
    data = np.zeros(20, dtype=dt)
    data["x"] = np.arange(20)
    path = tmp_path / "s.npy"
    np.save(path, data)
    out = np.concatenate(collect(pinfeed.Loader(path, 6, device="cpu", raw=True)))
    assert out.dtype == np.uint8 and out.shape == (20, dt.itemsize)
    assert out.tobytes() == data.tobytes()


@pytest.mark.parametrize("batch_size", [64, 100, 1000])
def test_raw_file_numpy_subarray_syntax(tmp_path, batch_size):
    data = np.random.default_rng(2).integers(0, 255, size=(300, 3, 31, 31), dtype=np.uint8)
    path = tmp_path / "records.bin"
    data.tofile(path)
    ref = np.memmap(path, dtype=np.uint8, mode="r").reshape(300, 3, 31, 31)
    loader = pinfeed.Loader(path, batch_size, device="cpu", dtype="3,31,31B")
    assert len(loader) == -(-300 // batch_size)
    out = np.concatenate(collect(loader))
    assert out.shape == (300, 3, 31, 31) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, ref)


def test_raw_file_numpy_dtype_and_shape(tmp_path):
    data = np.arange(50 * 6, dtype=np.float32).reshape(50, 2, 3)
    path = tmp_path / "records.f32"
    data.tofile(path)
    out = np.concatenate(
        collect(pinfeed.Loader(path, 16, device="cpu", dtype=np.float32, shape=(2, 3)))
    )
    np.testing.assert_array_equal(out, data)
    out = np.concatenate(
        collect(pinfeed.Loader(path, 16, device="cpu", dtype=np.dtype("(3,)f4"), shape=(2,)))
    )
    np.testing.assert_array_equal(out, data)


def test_numpy_array_source_and_len():
    data = np.arange(1001 * 4, dtype=np.int64).reshape(1001, 4)
    loader = pinfeed.Loader(data, 100, device="cpu")
    assert len(loader) == 11
    out = collect(loader)
    assert len(out) == 11
    np.testing.assert_array_equal(np.concatenate(out), data)
    assert pinfeed.Loader(data, 100, device="cpu", drop_last=True).__len__() == 10
    assert len(pinfeed.Loader(data, 100, device="cpu", epochs=3)) == 33


def test_one_dimensional_array_source():
    data = np.arange(77, dtype=np.float64)
    out = collect(pinfeed.Loader(data, 10, device="cpu"))
    assert out[0].shape == (10,)
    np.testing.assert_array_equal(np.concatenate(out), data)


def test_memmap_source(tmp_path):
    path = tmp_path / "m.bin"
    mm = np.memmap(path, dtype=np.uint16, mode="w+", shape=(500, 7))
    mm[:] = np.arange(3500).reshape(500, 7)
    mm.flush()
    ro = np.memmap(path, dtype=np.uint16, mode="r", shape=(500, 7))
    out = np.concatenate(collect(pinfeed.Loader(ro, 64, device="cpu")))
    np.testing.assert_array_equal(out, ro)


def test_source_kept_alive_without_user_reference():
    loader = pinfeed.Loader(np.arange(1000, dtype=np.int32).reshape(100, 10), 30, device="cpu")
    import gc

    gc.collect()
    np.testing.assert_array_equal(np.concatenate(list(loader)), np.arange(1000).reshape(100, 10))


def test_epochs_and_reiteration():
    data = np.arange(50, dtype=np.int32).reshape(25, 2)
    loader = pinfeed.Loader(data, 10, device="cpu", epochs=2)
    first = np.concatenate(list(loader))
    np.testing.assert_array_equal(first, np.concatenate([data, data]))
    second = np.concatenate(list(loader))
    np.testing.assert_array_equal(second, first)
    # A pass abandoned half way, then a fresh one.
    it = iter(loader)
    next(it)
    np.testing.assert_array_equal(np.concatenate(list(loader)), first)


def test_batches_stay_valid_after_loader_dropped():
    data = np.arange(4000, dtype=np.uint8).reshape(1000, 4)
    loader = pinfeed.Loader(data, 100, device="cpu", pinned_budget=64 << 10)
    kept = list(loader)
    del loader
    np.testing.assert_array_equal(np.concatenate(kept), data)


def test_stats():
    data = np.zeros((1000, 16), dtype=np.uint8)
    loader = pinfeed.Loader(data, 100, device="cpu", pinned_budget="1MiB", num_threads=2)
    list(loader)
    s = loader.stats()
    assert s["batches"] == 10 and s["records"] == 1000 and s["bytes"] == 16000
    assert s["device"] == "cpu" and s["threads"] == 2
    assert s["threads_reason"] == "2: as asked" and s["copy_gbps"] is None
    assert s["pinned_bytes"] <= 1 << 20
    assert s["pinned_allocations_after_start"] == 0
    assert s["pinned_numa"] == "not placed: no GPU (host backend)"
    assert isinstance(s["bottleneck"], str) and isinstance(s["explanation"], str)
    for key in ("elapsed", "startup", "read_time", "wait_free_slot", "consumer_wait", "gbps"):
        assert isinstance(s[key], float)
    assert 0 < s["startup"]
    assert "device_bytes_held" in s


def test_stats_tell_apart_the_waits_sequence_order_costs():
    # Two readers, two slots: readers wait for slots, and the copy thread for batches.
    data = np.arange(16000, dtype=np.uint8).reshape(1000, 16)
    loader = pinfeed.Loader(data, 100, device="cpu", pinned_budget=8192, num_threads=2)
    np.testing.assert_array_equal(np.concatenate(list(loader)), data)
    s = loader.stats()
    assert s["slots"] == 2
    # The parts told apart are parts of the whole waits (the Rust tests time them).
    assert 0 <= s["wait_filled_behind"] <= s["wait_filled"]
    assert 0 <= s["wait_free_slot_no_copy"] <= s["wait_free_slot"]


def test_default_threads_without_a_bus_are_one_per_core_up_to_eight():
    # The host backend has no bus to measure: the count falls back, and says so.
    data = np.zeros((1000, 16), dtype=np.uint8)
    loader = pinfeed.Loader(data, 100, device="cpu")
    list(loader)
    s = loader.stats()
    # At most one per core this process may use (Rust also counts a cgroup's CPU quota).
    assert 1 <= s["threads"] <= min(len(os.sched_getaffinity(0)), 8)
    assert "bus rate unknown" in s["threads_reason"]
    assert s["copy_gbps"] is None and s["bus_gbps"] is None


def test_torch_is_not_imported_for_cpu_batches():
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, pinfeed; "
        "list(pinfeed.Loader(np.zeros((10, 2)), 5, device='cpu')); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shuffle_is_real_and_silent():
    data = np.arange(100, dtype=np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = pinfeed.Loader(data, 10, device="cpu", shuffle=True, seed=3, rank=0, world_size=1)
        out = np.concatenate(list(loader))
    assert not np.array_equal(out, data)
    np.testing.assert_array_equal(np.sort(out), data)


def test_no_warning_without_shuffle():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(pinfeed.Loader(np.arange(10), 5, device="cpu"))


def test_torch_like_path_objects(tmp_path):
    data = np.arange(30, dtype=np.float32).reshape(10, 3)
    path = tmp_path / "x.npy"
    np.save(path, data)

    class P(os.PathLike):
        def __fspath__(self):
            return str(path)

    np.testing.assert_array_equal(np.concatenate(list(pinfeed.Loader(P(), 4, device="cpu"))), data)


def test_shards_safetensors_and_readers(tmp_path):
    """A directory of .npy shards, a glob, a safetensors file written by the safetensors
    library, and the direct and uring readers all deliver the records byte for byte."""
    import numpy as np

    import pinfeed

    rng = np.random.default_rng(3)
    parts = [rng.integers(0, 255, size=(n, 3, 31, 31), dtype=np.uint8) for n in (700, 1, 299)]
    shards = tmp_path / "shards"
    shards.mkdir()
    for k, part in enumerate(parts):
        np.save(shards / f"part-{k:03d}.npy", part)
    whole = np.concatenate(parts)
    for src in (shards, str(shards / "part-*.npy")):
        got = np.concatenate(list(pinfeed.Loader(src, 128, device="cpu")))
        assert np.array_equal(got, whole)
    path = tmp_path / "one.npy"
    np.save(path, whole)
    for reader in ("pread", "mmap", "direct", "uring", "register", "auto"):
        got = np.concatenate(list(pinfeed.Loader(str(path), 333, device="cpu", reader=reader)))
        assert np.array_equal(got, whole), reader
    # Shuffled: the mapped gather delivers what pread delivers, and the stats say which ran.
    shuffled = {}
    for reader, said in (("pread", "pread"), ("mmap", "mmap gather, pread ranges")):
        loader = pinfeed.Loader(str(path), 333, device="cpu", reader=reader, shuffle=True, seed=3)
        shuffled[reader] = np.concatenate(list(loader))
        assert loader.stats()["reader_description"] == said, loader.stats()
    assert np.array_equal(shuffled["pread"], shuffled["mmap"])
    assert not np.array_equal(shuffled["mmap"], whole)
    from safetensors.numpy import save_file

    st = tmp_path / "t.safetensors"
    save_file({"images": whole, "labels": np.arange(len(whole), dtype=np.int64)}, str(st))
    got = np.concatenate(list(pinfeed.Loader(str(st), 100, device="cpu", tensor="images")))
    assert np.array_equal(got, whole)
    labels = np.concatenate(list(pinfeed.Loader(str(st), 100, device="cpu", tensor="labels")))
    assert np.array_equal(labels, np.arange(len(whole)))
    with pytest.raises(pinfeed.PinfeedValueError, match="images"):
        pinfeed.Loader(str(st), 100, device="cpu", tensor="nope")
    with pytest.raises(pinfeed.PinfeedValueError, match="unknown reader"):
        pinfeed.Loader(str(path), 100, device="cpu", reader="telepathy")
