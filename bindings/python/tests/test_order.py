"""Shuffling, sharding and resume on the host backend: records identified by their values."""

import collections
import json
import subprocess
import sys

import numpy as np
import pytest

import pinfeed

WORLD_SIZES = [1, 2, 3, 8]
SEEDS = [0, 1, 0xDEAD_BEEF_CAFE_F00D]
SHUFFLES = [False, True, "block"]
N = 103

# Small rings: these tests make hundreds of loaders.
SMALL = dict(device="cpu", pinned_budget="256KiB", num_threads=2)


pytestmark = pytest.mark.usefixtures("no_launcher_env")


def ids(n=N):
    """Record i holds i, so a batch says which records it holds."""
    return np.arange(n, dtype=np.int64)


def rows(n=N, width=3):
    """Record i holds i * width .. (i + 1) * width: rows must arrive whole."""
    return np.arange(n * width, dtype=np.int32).reshape(n, width)


def block_opts(shuffle):
    return dict(block_size=5, block_window=3) if shuffle == "block" else {}


def epoch_batches(loader):
    return [np.asarray(b).copy() for b in loader]


@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shuffle", SHUFFLES)
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_share_out_every_record(world, seed, shuffle, drop_last):
    batch = 4
    per_rank = []
    for rank in range(world):
        loader = pinfeed.Loader(
            ids(),
            batch,
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world,
            drop_last=drop_last,
            **block_opts(shuffle),
            **SMALL,
        )
        got = epoch_batches(loader)
        assert len(got) == len(loader)
        want = pinfeed.epoch_order(
            N,
            batch,
            seed=seed,
            shuffle=shuffle,
            rank=rank,
            world_size=world,
            drop_last=drop_last,
            **block_opts(shuffle),
        )
        np.testing.assert_array_equal(np.concatenate(got), want)
        per_rank.append(got)
    # Every rank takes the same steps, of the same size on every rank.
    assert len({len(g) for g in per_rank}) == 1
    for step in zip(*per_rank):
        assert len({len(b) for b in step}) == 1
    assert all(len(b) == batch for b in per_rank[0][:-1])
    if drop_last:
        assert all(len(b) == batch for g in per_rank for b in g)

    # The global order, from which padding is drawn and the tail is dropped.
    order = pinfeed.epoch_order(N, 1, seed=seed, shuffle=shuffle, **block_opts(shuffle))
    assert sorted(order.tolist()) == list(range(N))
    counts = collections.Counter(int(r) for g in per_rank for b in g for r in b)
    if drop_last:
        kept = N // (world * batch) * world * batch
        assert sum(counts.values()) == kept
        assert set(counts) == set(order[:kept].tolist()) and set(counts.values()) == {1}
    else:
        total = -(-N // world) * world
        padding = set(order[: total - N].tolist())
        assert sum(counts.values()) == total and set(counts) == set(range(N))
        assert all(c == (2 if r in padding else 1) for r, c in counts.items())


def test_unshuffled_single_rank_is_file_order():
    data = rows()
    got = np.concatenate(epoch_batches(pinfeed.Loader(data, 10, rank=0, world_size=1, **SMALL)))
    np.testing.assert_array_equal(got, data)


@pytest.mark.parametrize("shuffle", [True, "block", "gpu"])
def test_rows_arrive_whole_in_the_documented_order(shuffle):
    data = rows(257, 5)
    loader = pinfeed.Loader(
        data, 16, shuffle=shuffle, seed=9, rank=1, world_size=3, **block_opts(shuffle), **SMALL
    )
    got = np.concatenate(epoch_batches(loader))
    idx = pinfeed.epoch_order(
        257, 16, seed=9, shuffle=shuffle, rank=1, world_size=3, **block_opts(shuffle)
    )
    np.testing.assert_array_equal(got, data[idx.astype(np.int64)])


@pytest.mark.parametrize("shuffle", [True, "block", "gpu"])
def test_seed_decides_the_order_and_epochs_differ(shuffle):
    def run(seed, **kw):
        loader = pinfeed.Loader(
            ids(), 8, shuffle=shuffle, seed=seed, **block_opts(shuffle), **SMALL, **kw
        )
        return [np.concatenate(epoch_batches(loader)) for _ in range(3)]

    a, b, c = run(5), run(5), run(6)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    # Successive iterations are successive epochs, each a different permutation.
    assert not np.array_equal(a[0], a[1]) and not np.array_equal(a[1], a[2])
    for e, x in enumerate(a):
        np.testing.assert_array_equal(np.sort(x), ids())
        np.testing.assert_array_equal(
            x, pinfeed.epoch_order(N, 8, seed=5, epoch=e, shuffle=shuffle, **block_opts(shuffle))
        )
    # epochs=3 in one pass gives the same three epochs.
    one_pass = pinfeed.Loader(
        ids(), 8, shuffle=shuffle, seed=5, epochs=3, **block_opts(shuffle), **SMALL
    )
    np.testing.assert_array_equal(np.concatenate(epoch_batches(one_pass)), np.concatenate(a))
    # And the pass after it continues with epoch 3.
    np.testing.assert_array_equal(
        np.concatenate(epoch_batches(one_pass))[:N],
        pinfeed.epoch_order(N, 8, seed=5, epoch=3, shuffle=shuffle, **block_opts(shuffle)),
    )


@pytest.mark.parametrize("shuffle", [True, "gpu"])
def test_set_epoch(shuffle):
    loader = pinfeed.Loader(ids(), 8, shuffle=shuffle, seed=2, rank=1, world_size=2, **SMALL)
    ref = [np.concatenate(epoch_batches(loader)) for _ in range(4)]
    fresh = pinfeed.Loader(ids(), 8, shuffle=shuffle, seed=2, rank=1, world_size=2, **SMALL)
    fresh.set_epoch(2)
    assert fresh.state_dict()["epoch"] == 2
    np.testing.assert_array_equal(np.concatenate(epoch_batches(fresh)), ref[2])
    # Without another set_epoch, the next iteration is epoch 3; setting the same epoch repeats it.
    np.testing.assert_array_equal(np.concatenate(epoch_batches(fresh)), ref[3])
    fresh.set_epoch(0)
    np.testing.assert_array_equal(np.concatenate(epoch_batches(fresh)), ref[0])
    fresh.set_epoch(0)
    np.testing.assert_array_equal(np.concatenate(epoch_batches(fresh)), ref[0])
    # As torch's DistributedSampler is driven: set_epoch before every epoch.
    for e in (1, 2):
        fresh.set_epoch(e)
        np.testing.assert_array_equal(np.concatenate(epoch_batches(fresh)), ref[e])


@pytest.mark.parametrize("world", [1, 3, 8])
@pytest.mark.parametrize("shuffle", [False, True, "block", "gpu"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_reproduces_the_rest_of_the_epoch(world, shuffle, drop_last):
    kw = dict(
        shuffle=shuffle,
        seed=11,
        world_size=world,
        drop_last=drop_last,
        **block_opts(shuffle),
        **SMALL,
    )
    data = rows(N, 2)
    for rank in sorted({0, world - 1}):
        ref_loader = pinfeed.Loader(data, 3, rank=rank, **kw)
        ref_loader.set_epoch(1)
        full = epoch_batches(ref_loader)
        after = pinfeed.Loader(data, 3, rank=rank, **kw)
        after.set_epoch(2)
        next_epoch = epoch_batches(after)
        for k in range(len(full) + 1):
            # A deep read-ahead: batches in the ring when the state is taken must not count.
            first = pinfeed.Loader(data, 3, rank=rank, prefetch=8, **kw)
            first.set_epoch(1)
            it = iter(first)
            for _ in range(k):
                next(it)
            state = json.loads(json.dumps(first.state_dict()))  # plain data, fit for a checkpoint
            want_position = (2, 0) if k == len(full) else (1, k)
            assert (state["epoch"], state["batches_done"]) == want_position
            second = pinfeed.Loader(data, 3, rank=rank, **kw)
            second.load_state_dict(state)
            tail = epoch_batches(second)
            want = full[k:] if k < len(full) else next_epoch
            assert len(tail) == len(want)
            for x, y in zip(tail, want):
                np.testing.assert_array_equal(x, y)


def test_resume_with_several_epochs_a_pass():
    kw = dict(shuffle=True, seed=3, epochs=3, world_size=2, rank=0, **SMALL)
    full = epoch_batches(pinfeed.Loader(ids(), 5, **kw))
    for k in (0, 1, 7, len(full) // 3, len(full) // 3 + 2, len(full) - 1):
        first = pinfeed.Loader(ids(), 5, **kw)
        it = iter(first)
        for _ in range(k):
            next(it)
        second = pinfeed.Loader(ids(), 5, **kw)
        second.load_state_dict(first.state_dict())
        rest = epoch_batches(second)
        # The rest of the epoch it stopped in, then `epochs - 1` more.
        per_epoch = len(full) // 3
        epoch = k // per_epoch
        want = full[k:] + epoch_batches_of(kw, 3, 3 + epoch)
        assert len(rest) == len(want)
        for x, y in zip(rest, want):
            np.testing.assert_array_equal(x, y)


def epoch_batches_of(kw, first, end):
    out = []
    for e in range(first, end):
        loader = pinfeed.Loader(ids(), 5, **dict(kw, epochs=1))
        loader.set_epoch(e)
        out += epoch_batches(loader)
    return out


def test_state_counts_what_the_consumer_received():
    loader = pinfeed.Loader(ids(), 10, shuffle=True, **SMALL)
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches_done"]) == (0, 0)
    it = iter(loader)
    next(it), next(it)
    assert loader.state_dict()["batches_done"] == 2
    # A new iteration supersedes the old one: the old pass raises rather than end quietly,
    # and no longer moves the position.
    it2 = iter(loader)
    next(it2)
    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 1)
    with pytest.raises(pinfeed.PinfeedError, match="ended by a newer iteration"):
        next(it)
    assert loader.state_dict()["batches_done"] == 1
    for _ in it2:
        pass
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches_done"]) == (2, 0)
    assert loader._stream.fingerprint == state["fingerprint"]
    assert set(state) >= {
        "epoch",
        "batches_done",
        "seed",
        "shuffle",
        "world_size",
        "rank",
        "num_records",
        "batch_size",
        "drop_last",
        "fingerprint",
    }


def test_states_of_another_spec_are_refused():
    loader = pinfeed.Loader(ids(), 8, shuffle=True, seed=4, rank=0, world_size=2, **SMALL)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    cases = {
        "num_records": pinfeed.Loader(
            ids(N + 1), 8, shuffle=True, seed=4, rank=0, world_size=2, **SMALL
        ),
        "batch_size": pinfeed.Loader(ids(), 9, shuffle=True, seed=4, rank=0, world_size=2, **SMALL),
        "seed": pinfeed.Loader(ids(), 8, shuffle=True, seed=5, rank=0, world_size=2, **SMALL),
        "drop_last": pinfeed.Loader(
            ids(), 8, shuffle=True, seed=4, rank=0, world_size=2, drop_last=True, **SMALL
        ),
        "shuffle": pinfeed.Loader(ids(), 8, shuffle="block", seed=4, rank=0, world_size=2, **SMALL),
    }
    for field, other in cases.items():
        with pytest.raises(pinfeed.PinfeedValueError, match=field) as err:
            other.load_state_dict(state)
        assert isinstance(err.value, ValueError) and "cannot resume" in str(err.value)
    tampered = dict(state, fingerprint=state["fingerprint"] ^ 1)
    with pytest.raises(pinfeed.PinfeedValueError, match="fingerprint"):
        loader.load_state_dict(tampered)
    for bad in ({}, {"epoch": 0}, [1, 2], None):
        with pytest.raises(pinfeed.PinfeedValueError, match="not a pinfeed Loader state"):
            loader.load_state_dict(bad)
    with pytest.raises(pinfeed.PinfeedValueError, match="batches_done"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "batches_done"})
    with pytest.raises(pinfeed.PinfeedValueError, match="cannot resume after batch 99"):
        loader.load_state_dict(dict(state, batches_done=99))
    # Another rank's state is fine (ranks move in step), and gpu-resident shares random's order.
    other_rank = pinfeed.Loader(ids(), 8, shuffle=True, seed=4, rank=1, world_size=2, **SMALL)
    other_rank.load_state_dict(state)
    assert other_rank.state_dict()["batches_done"] == 1
    resident = pinfeed.Loader(ids(), 8, shuffle="gpu", seed=4, rank=0, world_size=2, **SMALL)
    resident.load_state_dict(state)
    # Another world size resumes elastically (test_elastic.py): the 16 records read are skipped.
    wider = pinfeed.Loader(ids(), 8, shuffle=True, seed=4, rank=0, world_size=3, **SMALL)
    wider.load_state_dict(state)
    assert (wider.state_dict()["batches_done"], wider.state_dict()["consumed"]) == (0, 16)


def test_env_rank_and_world_size(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = pinfeed.Loader(ids(), 4, shuffle=True, seed=1, **SMALL)
    assert (loader.rank, loader.world_size) == (2, 3)
    per_rank = -(-N // 3)  # ceil(N / 3)
    assert len(loader) == -(-per_rank // 4)
    np.testing.assert_array_equal(
        np.concatenate(epoch_batches(loader)),
        pinfeed.epoch_order(N, 4, seed=1, rank=2, world_size=3),
    )
    state = loader.state_dict()
    assert (state["rank"], state["world_size"]) == (2, 3)
    # Arguments win over the environment, each on its own.
    assert pinfeed.Loader(ids(), 4, rank=0, **SMALL).world_size == 3
    assert pinfeed.Loader(ids(), 4, rank=1, world_size=2, **SMALL).rank == 1
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(pinfeed.PinfeedValueError, match="RANK"):
        pinfeed.Loader(ids(), 4, **SMALL)
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(pinfeed.PinfeedValueError, match="rank 3"):
        pinfeed.Loader(ids(), 4, **SMALL)


def test_defaults_are_one_process():
    loader = pinfeed.Loader(ids(), 4, **SMALL)
    assert (loader.rank, loader.world_size, loader.shuffle, loader.seed) == (0, 1, "none", 0)


@pytest.mark.parametrize("seed", SEEDS)
def test_block_shuffle_keeps_records_near_their_block(seed):
    block, window, n = 5, 3, 400
    loader = pinfeed.Loader(
        ids(n), 16, shuffle="block", seed=seed, block_size=block, block_window=window, **SMALL
    )
    order = np.concatenate(epoch_batches(loader))
    np.testing.assert_array_equal(np.sort(order), ids(n))
    assert not np.array_equal(order, ids(n))
    where = np.empty(n, dtype=np.int64)
    where[order] = np.arange(n)
    for b in range(-(-n // block)):
        positions = where[b * block : (b + 1) * block]
        assert positions.max() - positions.min() < window * block, (b, positions)


def test_block_defaults():
    loader = pinfeed.Loader(np.zeros((10, 1024), np.uint8), 4, shuffle="block", **SMALL)
    assert (loader.block_size, loader.block_window) == (1024, 16)
    assert (loader.state_dict()["block_size"], loader.state_dict()["block_window"]) == (1024, 16)
    big = pinfeed.Loader(
        np.zeros((3, 3 << 20), np.uint8), 1, shuffle="block", pinned_budget="64MiB", device="cpu"
    )
    assert big.block_size == 1


@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("drop_last", [False, True])
def test_resident_mode_on_cpu_equals_random(world, seed, drop_last):
    data = rows(N, 4)
    for rank in sorted({0, world - 1}):
        kw = dict(seed=seed, rank=rank, world_size=world, drop_last=drop_last, epochs=2, **SMALL)
        random = epoch_batches(pinfeed.Loader(data, 4, shuffle=True, **kw))
        resident_loader = pinfeed.Loader(data, 4, shuffle="gpu", **kw)
        assert len(resident_loader) == len(random)
        resident = epoch_batches(resident_loader)
        assert len(resident) == len(random)
        for x, y in zip(resident, random):
            assert isinstance(x, np.ndarray) and x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
        # The next iteration is the next pair of epochs, as for the streamed order.
        again = epoch_batches(resident_loader)
        want = _epochs(data, kw, 2, 4)
        assert len(again) == len(want)
        for x, y in zip(again, want):
            np.testing.assert_array_equal(x, y)


def _epochs(data, kw, first, end):
    out = []
    for e in range(first, end):
        loader = pinfeed.Loader(data, 4, shuffle=True, **dict(kw, epochs=1))
        loader.set_epoch(e)
        out += epoch_batches(loader)
    return out


def test_resident_mode_uploads_once_and_applies_the_transform_once():
    calls = []

    def double(raw, out):
        calls.append(len(raw))
        out[:] = raw * 2

    data = rows(50, 2)
    loader = pinfeed.Loader(data, 8, shuffle="gpu", seed=1, transform=double, **SMALL)
    first = np.concatenate(epoch_batches(loader))
    second = np.concatenate(epoch_batches(loader))
    assert sum(calls) == 50  # once, at the upload
    idx0 = pinfeed.epoch_order(50, 8, seed=1, epoch=0).astype(np.int64)
    idx1 = pinfeed.epoch_order(50, 8, seed=1, epoch=1).astype(np.int64)
    np.testing.assert_array_equal(first, data[idx0] * 2)
    np.testing.assert_array_equal(second, data[idx1] * 2)
    loader.close()
    np.testing.assert_array_equal(
        np.concatenate(epoch_batches(loader)),
        data[pinfeed.epoch_order(50, 8, seed=1, epoch=2).astype(np.int64)] * 2,
    )
    assert sum(calls) == 100  # close() dropped the copy: uploaded again


def test_resident_mode_refuses_a_dataset_over_budget():
    with pytest.raises(pinfeed.PinfeedMemoryError, match="device_budget") as err:
        pinfeed.Loader(rows(1000, 4), 8, shuffle="gpu", device_budget="1KiB", **SMALL)
    assert isinstance(err.value, MemoryError) and 'shuffle="block"' in str(err.value)
    pinfeed.Loader(rows(1000, 4), 8, shuffle="gpu", device_budget=16000, **SMALL)


def test_bad_order_options():
    for bad in ("sorted", 3, "gpus"):
        with pytest.raises(pinfeed.PinfeedValueError, match="shuffle"):
            pinfeed.Loader(ids(), 4, shuffle=bad, **SMALL)
    with pytest.raises(pinfeed.PinfeedValueError, match="block_size"):
        pinfeed.Loader(ids(), 4, shuffle=True, block_size=4, **SMALL)
    with pytest.raises(pinfeed.PinfeedValueError, match="rank 2 is out of range"):
        pinfeed.Loader(ids(), 4, rank=2, world_size=2, **SMALL)
    with pytest.raises(pinfeed.PinfeedValueError, match="rank 2 is out of range"):
        pinfeed.Loader(ids(), 4, rank=2, world_size=2, shuffle="gpu", **SMALL)
    with pytest.raises(pinfeed.PinfeedValueError, match="seed"):
        pinfeed.Loader(ids(), 4, seed=-1, **SMALL)
    with pytest.raises(pinfeed.PinfeedValueError, match="no batch"):
        pinfeed.Loader(ids(), 20, drop_last=True, world_size=8, rank=0, **SMALL)
    with pytest.raises(pinfeed.PinfeedValueError, match="block_size"):
        pinfeed.Loader(ids(), 4, shuffle="block", block_size=0, **SMALL)


def test_len_is_this_ranks_batches():
    for world in WORLD_SIZES:
        for drop_last in (False, True):
            for batch in (1, 4, 7):
                if drop_last and N < world * batch:
                    continue
                loader = pinfeed.Loader(
                    ids(),
                    batch,
                    rank=world - 1,
                    world_size=world,
                    drop_last=drop_last,
                    shuffle=True,
                    epochs=2,
                    **SMALL,
                )
                per_rank = N // (world * batch) * batch if drop_last else -(-N // world)
                assert len(loader) == 2 * -(-per_rank // batch) == len(list(loader))


def test_torch_is_not_imported_to_find_the_rank():
    code = (
        "import sys, numpy as np, pinfeed; "
        "l = pinfeed.Loader(np.zeros((10, 2)), 5, device='cpu', shuffle=True); list(l); "
        "l = pinfeed.Loader(np.zeros((10, 2)), 5, device='cpu', shuffle='gpu'); list(l); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_multiloader_splits_an_epoch_among_devices_and_processes():
    """A MultiLoader per process, several devices each: every record once per epoch (apart from
    the documented padding), the same number of steps everywhere, one batch per device a step."""
    import numpy as np

    import pinfeed

    n = 1001
    data = np.arange(n, dtype=np.int64).reshape(n, 1)
    for processes, devices in [(1, 3), (2, 2)]:
        seen = np.zeros(n, dtype=np.int64)
        steps = []
        for rank in range(processes):
            multi = pinfeed.MultiLoader(
                data,
                50,
                devices=["cpu"] * devices,
                rank=rank,
                world_size=processes,
                shuffle=True,
                seed=2,
                pinned_budget="3MiB",
            )
            count = 0
            for step in multi:
                assert len(step) == devices
                for batch in step:
                    np.add.at(seen, batch[:, 0], 1)
                count += 1
            assert count == len(multi)
            steps.append(count)
            multi.close()
        shards = processes * devices
        assert len(set(steps)) == 1
        assert seen.min() >= 1 and seen.max() <= 2
        assert (seen == 2).sum() == -n % shards
    with pytest.raises(ValueError, match="at least one device"):
        pinfeed.MultiLoader(data, 50, devices=[])
