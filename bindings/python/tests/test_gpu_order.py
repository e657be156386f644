"""Shuffling, sharding, resume and GPU-resident shuffling on CUDA. Deselected unless --gpu."""

import collections

import numpy as np
import pytest

import pinfeed

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("no_launcher_env")]

N = 5003


def ids(n=N):
    return np.arange(n, dtype=np.int64)


def images(n=N):
    return np.random.default_rng(0).integers(0, 256, size=(n, 3, 17, 17), dtype=np.uint8)


def host(batches):
    return [b.cpu().numpy() for b in batches]


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("shuffle", [False, True, "block", "gpu"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_share_out_every_record_on_cuda(torch, world, shuffle, drop_last):
    batch = 64
    block = dict(block_size=37, block_window=4) if shuffle == "block" else {}
    per_rank = []
    for rank in range(world):
        loader = pinfeed.Loader(
            ids(),
            batch,
            device="cuda",
            shuffle=shuffle,
            seed=7,
            rank=rank,
            world_size=world,
            drop_last=drop_last,
            **block,
        )
        got = list(loader)
        assert all(t.is_cuda and t.dtype == torch.int64 for t in got)
        assert len(got) == len(loader)
        got = host(got)
        want = pinfeed.epoch_order(
            N,
            batch,
            seed=7,
            shuffle=shuffle,
            rank=rank,
            world_size=world,
            drop_last=drop_last,
            **block,
        )
        np.testing.assert_array_equal(np.concatenate(got), want)
        per_rank.append(got)
    assert len({len(g) for g in per_rank}) == 1
    counts = collections.Counter(int(r) for g in per_rank for b in g for r in b)
    if drop_last:
        assert set(counts.values()) == {1}
        assert sum(counts.values()) == N // (world * batch) * world * batch
    else:
        assert set(counts) == set(range(N))
        assert sum(counts.values()) == -(-N // world) * world


@pytest.mark.parametrize("world", [1, 3])
def test_resident_values_equal_the_source_in_random_order(torch, world):
    data = images()
    for rank in range(world):
        kw = dict(device="cuda", seed=3, rank=rank, world_size=world, epochs=2)
        resident = list(pinfeed.Loader(data, 256, shuffle="gpu", **kw))
        streamed = list(pinfeed.Loader(data, 256, shuffle=True, **kw))
        assert len(resident) == len(streamed)
        for r, s in zip(resident, streamed):
            assert r.is_cuda and r.dtype == torch.uint8 and r.shape == s.shape
            assert torch.equal(r, s)
        for epoch in range(2):
            idx = pinfeed.epoch_order(
                N, 256, seed=3, epoch=epoch, rank=rank, world_size=world
            ).astype(np.int64)
            per = len(resident) // 2
            got = torch.cat(resident[epoch * per : (epoch + 1) * per]).cpu().numpy()
            np.testing.assert_array_equal(got, data[idx])


def test_resident_with_transform_and_resume(torch):
    data = images(1000)
    kw = dict(device="cuda", shuffle="gpu", seed=5, transform=pinfeed.transforms.ToFloat())
    full = list(pinfeed.Loader(data, 64, **kw))
    first = pinfeed.Loader(data, 64, **kw)
    it = iter(first)
    for _ in range(5):
        next(it)
    second = pinfeed.Loader(data, 64, **kw)
    second.load_state_dict(first.state_dict())
    rest = list(second)
    assert len(rest) == len(full) - 5
    for a, b in zip(rest, full[5:]):
        assert a.dtype == torch.float32 and torch.equal(a, b)
    idx = pinfeed.epoch_order(1000, 64, seed=5).astype(np.int64)
    np.testing.assert_array_equal(
        torch.cat(full).cpu().numpy(), data[idx].astype(np.float32) * np.float32(1 / 255)
    )


def test_resident_over_budget_is_refused(torch):
    with pytest.raises(pinfeed.PinfeedMemoryError, match="device_budget"):
        pinfeed.Loader(images(1000), 64, device="cuda", shuffle="gpu", device_budget="64KiB")


def test_streamed_resume_on_cuda(torch):
    data = images()
    kw = dict(device="cuda", shuffle=True, seed=9, rank=1, world_size=2, prefetch=8)
    full = host(pinfeed.Loader(data, 128, **kw))
    for k in (0, 1, 9, len(full) - 1, len(full)):
        first = pinfeed.Loader(data, 128, **kw)
        it = iter(first)
        for _ in range(k):
            next(it)
        second = pinfeed.Loader(data, 128, **kw)
        second.load_state_dict(first.state_dict())
        rest = host(second)
        if k == len(full):
            nxt = pinfeed.Loader(data, 128, **kw)
            nxt.set_epoch(1)
            want = host(nxt)
        else:
            want = full[k:]
        assert len(rest) == len(want)
        for a, b in zip(rest, want):
            np.testing.assert_array_equal(a, b)


def test_rank_from_an_initialised_process_group(torch, tmp_path, monkeypatch):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch without distributed")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        monkeypatch.setenv("RANK", "5")  # the process group wins over the environment
        monkeypatch.setenv("WORLD_SIZE", "9")
        loader = pinfeed.Loader(ids(100), 10, device="cuda", shuffle=True)
        assert (loader.rank, loader.world_size) == (0, 1)
    finally:
        dist.destroy_process_group()


def test_resident_orders_ahead_on_cuda_across_jumps_and_streams(torch):
    """Orders computed ahead into pinned memory and copied without a host sync: still
    ``epoch_order``'s after set_epoch jumps, and when the gathers move to another stream than
    the index was copied on."""
    data = images(2000)
    loader = pinfeed.Loader(data, 128, device="cuda", shuffle="gpu", seed=4)
    side = torch.cuda.Stream()
    for epoch, switch in [(0, False), (1, False), (7, True), (8, False), (2, True), (3, False)]:
        loader.set_epoch(epoch)
        it = iter(loader)
        got = [next(it)]  # the index is copied on the default stream
        with torch.cuda.stream(side if switch else torch.cuda.current_stream()):
            got += list(it)
        side.synchronize()
        idx = pinfeed.epoch_order(2000, 128, seed=4, epoch=epoch).astype(np.int64)
        np.testing.assert_array_equal(torch.cat(got).cpu().numpy(), data[idx])
    orders = loader._resident._orders
    with orders._cond:
        while orders._running:
            orders._cond.wait()
        kept = list(orders._ready.values())
    assert kept and all(h.is_pinned() and h.dtype == torch.int64 for h in kept)
    workers = list(orders._threads)
    assert workers
    loader.close()
    assert not any(t.is_alive() for t in workers)
