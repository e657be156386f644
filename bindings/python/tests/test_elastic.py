"""Elastic resume: a state saved at one world size resumes at another, on the host backend.

Records hold their own index, so every batch says which records it holds.
"""

import collections

import numpy as np
import pytest
from resume_helpers import elastic_resume

import pinfeed

WORLD_SIZES = [1, 2, 3, 8]
SHUFFLES = ["none", "random", "block"]
N = 103
BATCH = 4
SEED = 11

# Small rings: these tests make hundreds of loaders.
SMALL = dict(device="cpu", pinned_budget="256KiB", num_threads=2)

pytestmark = pytest.mark.usefixtures("no_launcher_env")


def ids(n=N):
    return np.arange(n, dtype=np.int64)


def order_opts(shuffle):
    opts = dict(shuffle=shuffle, seed=SEED)
    if shuffle == "block":
        opts.update(block_size=5, block_window=3)
    return opts


def loaders(world, shuffle, drop_last, **kw):
    return [
        pinfeed.Loader(
            ids(),
            BATCH,
            rank=r,
            world_size=world,
            drop_last=drop_last,
            **order_opts(shuffle),
            **kw,
            **SMALL,
        )
        for r in range(world)
    ]


def global_order(shuffle):
    """`P`, the epoch's global order: what one rank with batches of one reads."""
    return [int(x) for x in pinfeed.epoch_order(N, 1, epoch=0, **order_opts(shuffle))]


def by_step(per_rank):
    """Records in the order the job reads them: step by step, rank by rank."""
    out = []
    for step in zip(*per_rank):
        for batch in step:
            out.extend(int(x) for x in batch)
    return out


def run_and_save(world, shuffle, drop_last, steps):
    """`world` ranks each receive `steps` batches, then save."""
    seen, states = [], []
    for loader in loaders(world, shuffle, drop_last):
        it = iter(loader)
        seen.append([np.asarray(next(it)).copy() for _ in range(steps)])
        states.append(loader.state_dict())
    return seen, states


@pytest.mark.parametrize("old", WORLD_SIZES)
@pytest.mark.parametrize("new", WORLD_SIZES)
@pytest.mark.parametrize("shuffle", SHUFFLES)
@pytest.mark.parametrize("drop_last", [False, True])
def test_an_elastic_resume_reads_the_rest_of_the_epoch_once(old, new, shuffle, drop_last):
    uninterrupted = [[np.asarray(b).copy() for b in lo] for lo in loaders(old, shuffle, drop_last)]
    steps = len(uninterrupted[0])
    p = global_order(shuffle)
    for k in sorted({1, steps // 2, steps - 1} - {0}):
        seen, states = run_and_save(old, shuffle, drop_last, k)
        for mine, full in zip(seen, uninterrupted):
            np.testing.assert_array_equal(np.concatenate(mine), np.concatenate(full[:k]))
        before = by_step(seen)
        consumed = k * old * BATCH
        assert before == p[:consumed], "the job read a prefix of the global order"

        resumed = loaders(new, shuffle, drop_last)
        for loader in resumed:
            loader.load_state_dict(states[0] if old == new else pinfeed.merge_states(states))
        if drop_last and old != new and N - consumed < new * BATCH:
            # Not one full step of the new ranks is left: the epoch is over.
            assert all(lo.state_dict()["epoch"] == 1 for lo in resumed)
            continue
        lengths = [len(lo) for lo in resumed]
        per_rank = [[np.asarray(b).copy() for b in lo] for lo in resumed]
        counts = [len(batches) for batches in per_rank]
        what = f"{old} -> {new} ranks after {k} steps"
        assert len(set(counts)) == 1, what
        after = by_step(per_rank)
        if old == new:
            # An ordinary resume: exactly the uninterrupted run's remaining batches.
            assert after == by_step([full[k:] for full in uninterrupted]), what
            continue
        assert counts == lengths, f"{what}: len() is the rest of the epoch"
        assert not set(before) & set(after), f"{what}: a consumed record came again"
        rest = p[consumed:]
        if drop_last:
            kept = len(rest) // (new * BATCH) * new * BATCH
            assert after == rest[:kept], what
            assert len(rest) - kept < new * BATCH, "only a short tail is left out"
        else:
            repeats = collections.Counter(after) - collections.Counter(rest)
            assert after[: len(rest)] == rest, what
            assert sum(repeats.values()) < new, f"{what}: padding only"
            assert set(before) | set(after) == set(range(N)), f"{what}: a record was lost"
            full = set(by_step(uninterrupted))
            assert set(before) | set(after) == full, what
        # The next epoch is an ordinary epoch at the new world size.
        fresh = loaders(new, shuffle, drop_last)
        for loader, again in zip(resumed, fresh):
            again.set_epoch(1)
            assert len(loader) == len(again)
            np.testing.assert_array_equal(
                np.concatenate([np.asarray(b) for b in loader]),
                np.concatenate([np.asarray(b) for b in again]),
            )
            assert loader.state_dict()["epoch"] == 2


def test_states_record_the_split_and_resume_again_at_a_third_world_size():
    seen, states = run_and_save(8, "random", False, 2)
    first = loaders(3, "random", False)
    for loader in first:
        loader.load_state_dict(states[0])
        assert loader.state_dict()["consumed"] == 2 * 8 * BATCH
    got3 = []
    for loader in first:
        it = iter(loader)
        got3.append([np.asarray(next(it)).copy() for _ in range(2)])  # of 4: 39 records left
    saved = [loader.state_dict() for loader in first]
    assert all(s["batches_done"] == 2 and s["consumed"] == 64 for s in saved)
    second = loaders(2, "random", False)
    for loader in second:
        loader.load_state_dict(saved[1])
        assert loader.state_dict()["consumed"] == 64 + 2 * 3 * BATCH
    after = by_step([[np.asarray(b) for b in lo] for lo in second])
    read = by_step(seen) + by_step(got3)
    assert read == global_order("random")[: len(read)]
    assert sorted(set(read) | set(after)) == list(range(N))
    assert not set(read) & set(after)


def test_ranks_at_different_steps_resume_from_the_slowest():
    loaders2 = loaders(2, "random", False)
    seen, states = [], []
    for loader, k in zip(loaders2, (3, 5)):
        it = iter(loader)
        seen.append([int(x) for _ in range(k) for x in np.asarray(next(it))])
        states.append(loader.state_dict())
    merged = pinfeed.merge_states(states)
    assert merged["batches_done"] == 3
    assert pinfeed.merge_states(reversed(states))["batches_done"] == 3
    resumed = loaders(3, "random", False)
    for loader in resumed:
        loader.load_state_dict(merged)
    after = by_step([[np.asarray(b) for b in lo] for lo in resumed])
    p = global_order("random")
    assert after[: N - 24] == p[24:], "the records read past the slowest rank come again"
    with pytest.raises(pinfeed.PinfeedValueError, match="different jobs"):
        pinfeed.merge_states([states[0], dict(states[1], world_size=4)])
    with pytest.raises(pinfeed.PinfeedValueError, match="no state"):
        pinfeed.merge_states([])


def test_a_finished_epoch_or_a_too_short_rest_resumes_at_the_next_epoch():
    _, states = run_and_save(2, "random", True, 12)  # 103 // 8 = 12 steps: all of epoch 0
    loader = loaders(3, "random", True)[0]
    loader.load_state_dict(states[0])
    assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (1, 0)
    # After 10 steps at 2 ranks 23 records are left: not one full step of 8 ranks.
    _, states = run_and_save(2, "random", True, 10)
    loader = loaders(8, "random", True)[0]
    loader.load_state_dict(states[0])
    assert loader.state_dict()["epoch"] == 1
    assert len(loader) == len(loaders(8, "random", True)[0])


def test_gpu_shuffle_resumes_elastically_like_random():
    _, states = run_and_save(3, "random", False, 2)
    resident = loaders(2, "gpu", False)
    streamed = loaders(2, "random", False)
    for a, b in zip(resident, streamed):
        a.load_state_dict(states[0])
        b.load_state_dict(states[0])
        assert len(a) == len(b)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert a.state_dict()["epoch"] == b.state_dict()["epoch"] == 1


def test_other_orders_are_still_refused():
    _, states = run_and_save(2, "random", False, 1)
    cases = {
        "seed": dict(shuffle="random", seed=SEED + 1),
        "shuffle": dict(shuffle="block", seed=SEED),
    }
    for field, opts in cases.items():
        other = pinfeed.Loader(ids(), BATCH, rank=0, world_size=3, **opts, **SMALL)
        with pytest.raises(pinfeed.PinfeedValueError, match=field):
            other.load_state_dict(states[0])
    for field, other in {
        "batch_size": pinfeed.Loader(
            ids(), BATCH + 1, rank=0, world_size=3, **order_opts("random"), **SMALL
        ),
        "num_records": pinfeed.Loader(
            ids(N + 1), BATCH, rank=0, world_size=3, **order_opts("random"), **SMALL
        ),
        "drop_last": pinfeed.Loader(
            ids(), BATCH, rank=0, world_size=3, drop_last=True, **order_opts("random"), **SMALL
        ),
    }.items():
        with pytest.raises(pinfeed.PinfeedValueError, match=field):
            other.load_state_dict(states[0])
    target = loaders(3, "random", False)[0]
    with pytest.raises(pinfeed.PinfeedValueError, match="fingerprint"):
        target.load_state_dict(dict(states[0], fingerprint=states[0]["fingerprint"] ^ 1))
    with pytest.raises(pinfeed.PinfeedValueError, match="cannot resume after batch 99"):
        target.load_state_dict(dict(states[0], batches_done=99))
    # A state without `consumed` (saved before it existed) loads as before.
    old_style = {k: v for k, v in states[0].items() if k != "consumed"}
    target.load_state_dict(old_style)
    assert target.state_dict()["consumed"] == 1 * 2 * BATCH


def test_issue51_merge_states_misuse_says_what_is_wrong(tmp_path):
    # Issue 51 item 16: no raw TypeError or KeyError while the error is being built.
    states = [ld.state_dict() for ld in loaders(2, True, False)]
    no_fingerprint = {k: v for k, v in states[1].items() if k != "fingerprint"}
    no_epoch = {k: v for k, v in states[1].items() if k != "epoch"}
    for bad, says in [
        (5, "expected a list of Loader.state_dict"),
        ("states", "expected a list"),
        (states[0], "expected a list"),
        ([None], "state 0 is a NoneType"),
        (["abc"], "state 0 is a str"),
        ([states[0], no_epoch], "state 1: the state has no 'epoch'"),
        ([states[0], {**states[1], "epoch": float("nan")}], "state epoch must be an int"),
        ([states[0], no_fingerprint], "state 1 has no 'fingerprint'"),
    ]:
        with pytest.raises(pinfeed.PinfeedValueError, match=says):
            pinfeed.merge_states(bad)
    assert pinfeed.merge_states(iter(states)) == states[0]
    # The same for an ImageLoader state whose `images` entry is malformed.
    image = __import__("pathlib").Path(__file__).resolve().parents[3]
    image = image / "crates/source/tests/fixtures/images/baseline.jpg"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(image.read_bytes())
    loader = pinfeed.ImageLoader(tmp_path, 1, size=8, device="cpu")
    state = loader.state_dict()
    for bad, says in [
        (None, "'images' entry must be a dict of height, width, num_samples, not NoneType"),
        ([1, 2], "'images' entry must be a dict"),
        ({"height": "8"}, "saved with height '8'"),
    ]:
        with pytest.raises(pinfeed.PinfeedValueError, match=says):
            loader.load_state_dict({**state, "images": bad})


def test_a_state_saved_on_other_data_of_the_same_size_is_refused(tmp_path):
    # Two files of one size and layout give one order: only their bytes tell them apart.
    rng = np.random.default_rng(5)
    paths = []
    for name in ("a.npy", "b.npy"):
        np.save(tmp_path / name, rng.integers(0, 255, size=(64, 3), dtype=np.uint8))
        paths.append(tmp_path / name)
    a = pinfeed.Loader(paths[0], 8, device="cpu", shuffle=True)
    it = iter(a)
    next(it)
    state = a.state_dict()
    assert isinstance(state["data_fingerprint"], int)
    # The same data under another name resumes.
    (tmp_path / "copy.npy").write_bytes(paths[0].read_bytes())
    pinfeed.Loader(tmp_path / "copy.npy", 8, device="cpu", shuffle=True).load_state_dict(state)
    with pytest.raises(pinfeed.PinfeedValueError, match="other data"):
        pinfeed.Loader(paths[1], 8, device="cpu", shuffle=True).load_state_dict(state)
    other = pinfeed.Loader(paths[1], 8, device="cpu", shuffle=True).state_dict()
    with pytest.raises(pinfeed.PinfeedValueError, match="data_fingerprint differs"):
        pinfeed.merge_states([state, other])


@pytest.mark.parametrize("w_from,w_to", [(1, 2), (2, 3), (3, 2), (3, 1)])
def test_sequential_token_windows_resume_elastically(tmp_path, w_from, w_to):
    # TokenLoader takes one step a batch for sequential windows: its next step after an elastic
    # resume is the Loader's position moved to the new world size, not the old world's count.
    path = tmp_path / "tokens.bin"
    np.arange(4000, dtype=np.uint16).tofile(path)
    opts = dict(token_dtype="uint16", sample="sequential", shuffle=True, seed=1, **SMALL)

    def ranks(world):
        return [
            pinfeed.TokenLoader(path, 4, 3, rank=r, world_size=world, **opts) for r in range(world)
        ]

    def firsts(step):
        return [int(v) for v in np.asarray(step[0])[:, 0]]

    head, tail, whole = elastic_resume(ranks, firsts, w_from, w_to)
    n = 999 - len(head)  # the epoch's windows, before what pads its last step
    assert head + tail[:n] == whole[: len(head) + n]
