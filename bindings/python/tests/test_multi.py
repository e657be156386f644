"""MultiLoader(replicate=True): every device gets the same batches, read once (host backend;
the GPU tests at the end run with --gpu)."""

import numpy as np
import pytest

import pinfeed

pytestmark = pytest.mark.usefixtures("no_launcher_env")

SMALL = dict(pinned_budget="512KiB", num_threads=3)


def single(source, batch_size, **options):
    """Each batch a single-device Loader delivers, as a numpy array."""
    return [np.array(b) for b in pinfeed.Loader(source, batch_size, device="cpu", **options)]


@pytest.mark.parametrize("devices", [2, 3])
@pytest.mark.parametrize("shuffle", [False, True, "block"])
@pytest.mark.parametrize("batch_size", [7, 50, 1000])
def test_every_device_gets_the_single_device_batches(devices, shuffle, batch_size):
    data = np.random.default_rng(1).integers(0, 1 << 62, size=(1000, 5), dtype=np.int64)
    data[:, 0] = np.arange(1000)  # record i holds i
    options = dict(shuffle=shuffle, seed=4, epochs=2, **SMALL)
    want = single(data, batch_size, **options)
    multi = pinfeed.MultiLoader(
        data, batch_size, devices=["cpu"] * devices, replicate=True, **options
    )
    assert len(multi) == len(want)
    steps = list(multi)
    assert len(steps) == len(want)
    for step, batch in zip(steps, want):
        assert isinstance(step, tuple) and len(step) == devices
        for x in step:
            np.testing.assert_array_equal(x, batch)
    for device in range(devices):
        got = np.concatenate([step[device] for step in steps])
        # Every record once per epoch, on every device.
        assert np.bincount(got[:, 0], minlength=1000).tolist() == [2] * 1000
        if not shuffle:
            np.testing.assert_array_equal(got, np.concatenate([data, data]))
    stats = multi.stats()
    assert stats["replicated"] is True
    assert stats["read_bytes"] == 2 * data.nbytes, "read once"
    assert stats["bytes"] == devices * 2 * data.nbytes
    assert [d["bytes"] for d in stats["devices"]] == [2 * data.nbytes] * devices
    assert stats["pinned_bytes_peak"] <= 512 << 10


def test_pieces_are_copied_to_every_device(tmp_path):
    data = np.random.default_rng(2).integers(0, 256, size=(3000, 100), dtype=np.uint8)
    path = tmp_path / "d.npy"
    np.save(path, data)
    # Batches of 100 KB in pieces of about 4 KiB: 25 pieces each, on both devices.
    multi = pinfeed.MultiLoader(
        path, 1000, devices=["cpu", "cpu"], replicate=True, piece_size="4KiB", **SMALL
    )
    a, b = (np.concatenate(xs) for xs in zip(*multi))
    np.testing.assert_array_equal(a, data)
    np.testing.assert_array_equal(b, data)
    assert multi.stats()["read_bytes"] == data.nbytes


def test_replicate_false_is_unchanged_and_stats_say_who_read_what():
    data = np.arange(400, dtype=np.int64).reshape(400, 1)
    split = pinfeed.MultiLoader(data, 20, devices=["cpu", "cpu"], **SMALL)
    assert not split.replicate
    seen = np.concatenate([x for step in split for x in step])[:, 0]
    assert sorted(seen.tolist()) == list(range(400)), "split: every record once over both"
    stats = split.stats()
    assert stats["replicated"] is False
    assert stats["bytes"] == stats["read_bytes"] == data.nbytes
    assert len(stats["devices"]) == 2 and len(stats["loaders"]) == 2
    # Combined by the Rust rules: counts summed, the longest wall time and start, one verdict.
    parts = stats["loaders"]
    for key in ("batches", "records", "threads", "slots", "pinned_bytes"):
        assert stats[key] == sum(p[key] for p in parts), key
    assert stats["elapsed"] == max(p["elapsed"] for p in parts)
    assert stats["startup"] == max(p["startup"] for p in parts)
    assert stats["bottleneck"] and stats["explanation"]


def test_resume_and_set_epoch_apply_to_every_device():
    data = np.arange(300, dtype=np.int64).reshape(300, 1)
    options = dict(shuffle=True, seed=7, **SMALL)
    multi = pinfeed.MultiLoader(data, 30, devices=["cpu", "cpu"], replicate=True, **options)
    it = iter(multi)
    first = [next(it) for _ in range(4)]
    state = multi.state_dict()
    assert len(state) == 1 and state[0]["batches_done"] == 4
    rest = list(it)
    again = pinfeed.MultiLoader(data, 30, devices=["cpu", "cpu"], replicate=True, **options)
    again.load_state_dict(state)
    resumed = list(again)
    assert len(resumed) == len(rest) == 6
    for a, b in zip(rest, resumed):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert all(np.array_equal(s[0], s[1]) for s in first)
    again.set_epoch(3)
    epoch3 = [step[0] for step in again]
    loader = pinfeed.Loader(data, 30, device="cpu", **options)
    loader.set_epoch(3)
    for x, y in zip(epoch3, loader):
        np.testing.assert_array_equal(x, np.array(y))


def test_what_replication_cannot_do_is_refused(tmp_path):
    data = np.zeros((100, 4), dtype=np.uint8)
    path = tmp_path / "z.npy"
    np.save(path, data)
    with pytest.raises(pinfeed.PinfeedValueError, match='shuffle="gpu"'):
        pinfeed.MultiLoader(data, 10, devices=["cpu", "cpu"], replicate=True, shuffle="gpu")
    with pytest.raises(pinfeed.PinfeedValueError, match="register reader"):
        pinfeed.MultiLoader(path, 10, devices=["cpu", "cpu"], replicate=True, reader="register")
    with pytest.raises(pinfeed.PinfeedValueError, match="unknown device"):
        pinfeed.MultiLoader(data, 10, devices=["cpu", "tpu:0"], replicate=True)
    with pytest.raises(ValueError, match="at least one device"):
        pinfeed.MultiLoader(data, 10, devices=[], replicate=True)
    with pytest.raises(pinfeed.PinfeedError):
        pinfeed.MultiLoader(data, 10, devices=["cpu", "cpu"], replicate=True, pinned_budget=100)


@pytest.mark.gpu
def test_gpu_replicated_twice_to_one_gpu(torch, tmp_path):
    data = np.random.default_rng(3).integers(0, 256, size=(20_000, 3, 31, 31), dtype=np.uint8)
    path = tmp_path / "r.npy"
    np.save(path, data)
    multi = pinfeed.MultiLoader(path, 4096, devices=["cuda:0", "cuda:0"], replicate=True)
    steps = list(multi)
    for device in range(2):
        got = torch.cat([step[device] for step in steps])
        assert got.is_cuda
        np.testing.assert_array_equal(got.cpu().numpy(), data)
    stats = multi.stats()
    assert stats["read_bytes"] == data.nbytes and stats["bytes"] == 2 * data.nbytes
