"""Loader mixtures (issue 49): a dict of record sources, on the host backend.

Source ``s`` holds int64 records ``[s * 100000 + k, k, k]`` (record ``k``), so a record says
which source it came from and which of its records it is.
"""

import itertools

import numpy as np
import pytest

import pinfeed
from pinfeed import Loader

pytestmark = pytest.mark.usefixtures("no_launcher_env")

BASE = 100000
NAMES = ("web", "code", "math")
SHARES = {"web": 0.5, "code": 0.3, "math": 0.2}
SMALL = dict(device="cpu", pinned_budget="256KiB", num_threads=2)


def write(tmp_path, sizes, names=NAMES):
    sources = {}
    for s, (name, n) in enumerate(zip(names, sizes)):
        k = np.arange(n, dtype=np.int64)
        path = tmp_path / f"{name}.npy"
        np.save(path, np.stack([s * BASE + k, k, k], axis=1))
        sources[name] = str(path)
    return sources


@pytest.fixture
def three(tmp_path):
    """Three .npy sources of 37, 50 and 20 records."""
    return write(tmp_path, (37, 50, 20))


def mix(sources, batch, **kw):
    kw.setdefault("weights", SHARES)
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    return Loader(sources, batch, **SMALL, **kw)


def records(batch):
    """(source, record) of each row of a batch."""
    return [(int(v) // BASE, int(v) % BASE) for v in np.asarray(batch)[:, 0]]


def run(loader, steps=None):
    return [records(b) for b in itertools.islice(loader, steps)]


def count(batch, s):
    return sum(1 for src, _ in batch if src == s)


def test_a_dict_of_sources_is_a_mixture_of_their_records(three):
    loader = mix(three, 10)
    assert loader.source == "mixture(web, code, math)"
    for batch in loader:
        rows = np.asarray(batch)
        assert rows.shape[1:] == (3,) and rows.dtype == np.int64
        assert (rows[:, 1] == rows[:, 0] % BASE).all()  # whole records, unchanged


def test_every_exact_step_holds_each_share(tmp_path):
    # 5,000 / 3,000 / 2,000 records: 1,000 steps of 10 spend every source at once.
    batches = run(mix(write(tmp_path, (5000, 3000, 2000)), 10, shuffle=True))
    assert len(batches) == 1000
    for step, b in enumerate(batches):
        assert [count(b, s) for s in range(3)] == [5, 3, 2], step


def test_sampled_shares_come_within_one_percent(tmp_path):
    sources = write(tmp_path, (20000, 20000, 20000))
    batches = run(mix(sources, 10, mode="sampled", on_exhausted="cycle", steps=1000))
    assert len(batches) == 1000
    flat = [r for b in batches for r in b]
    for s, share in enumerate(SHARES.values()):
        assert abs(count(flat, s) / len(flat) - share) < 0.01, s
    assert any(count(b, 0) != 5 for b in batches)


def test_each_record_comes_once_a_pass(three):
    # "code" stops the epoch after its one pass; the others cycle, each pass in a new order.
    loader = mix(
        three, 10, shuffle=True, on_exhausted={"web": "cycle", "code": "stop", "math": "cycle"}
    )
    flat = [r for b in run(loader) for r in b]
    for s, n in enumerate((37, 50, 20)):
        seen = [k for src, k in flat if src == s]
        for k in range(0, len(seen), n):
            one_pass = seen[k : k + n]
            assert len(set(one_pass)) == len(one_pass), (s, k)
            if len(one_pass) == n:
                assert sorted(one_pass) == list(range(n)), (s, k)
        if len(seen) >= 2 * n:
            assert seen[:n] != seen[n : 2 * n]
    assert sorted(k for src, k in flat if src == 1) == list(range(50))


def test_resume_after_any_step_equals_the_uninterrupted_run(three):
    kw = dict(seed=5, shuffle=True, on_exhausted={"code": "stop"})
    whole = run(mix(three, 5, **kw))
    for k in range(len(whole)):
        first = mix(three, 5, **kw)
        head = run(first, k)
        state = first.state_dict()
        assert state["mixture"]["positions"] == {
            n: sum(count(b, s) for b in head) for s, n in enumerate(NAMES)
        }
        again = mix(three, 5, **kw)
        again.load_state_dict(state)
        assert head + run(again) == whole, k
    # The next iteration is the next epoch, a new blend of new passes.
    loader = mix(three, 5, **kw)
    assert run(loader) == whole and run(loader) != whole


def global_run(loaders, steps=None):
    per_rank = [run(ld, steps) for ld in loaders]
    return [r for step in zip(*per_rank) for b in step for r in b]


@pytest.mark.parametrize("w_from,w_to", list(itertools.product((1, 2, 3), repeat=2)))
def test_elastic_resume_gives_the_uninterrupted_global_sequence(three, w_from, w_to):
    kw = dict(seed=2, shuffle=True, on_exhausted={"code": "stop"})

    def ranks(world):
        return [mix(three, 3, rank=r, world_size=world, **kw) for r in range(world)]

    whole = global_run(ranks(w_from))
    first = ranks(w_from)
    head = global_run(first, 4)
    state = first[0].state_dict()
    rest = ranks(w_to)
    for ld in rest:
        ld.load_state_dict(state)
    tail = global_run(rest)
    n = first[0].num_samples - len(head)
    assert head + tail[:n] == whole[: len(head) + n]
    if w_from == w_to:
        assert head + tail == whole
    else:
        assert set(tail[n:]) <= set(tail[:n])


def test_a_curriculum_survives_a_resume_across_its_step(tmp_path):
    sources = write(tmp_path, (1000, 1000, 1000))
    plan = [(0, {"web": 0.5, "code": 0.5}), (6, {"web": 0.9, "code": 0.1})]
    whole = run(mix(sources, 10, weights=plan), 10)
    assert [count(b, 0) for b in whole] == [5] * 6 + [9] * 4
    first = mix(sources, 10, weights=plan)
    head = run(first, 3)
    state = first.state_dict()
    again = mix(sources, 10, weights=plan[0][1])
    again.load_state_dict(state)
    assert head + run(again, 7) == whole
    later = mix(sources, 10, weights=plan[0][1])
    later.set_weights({"math": 1.0}, from_step=8)
    resumed = mix(sources, 10, weights=plan[0][1])
    resumed.load_state_dict(later.state_dict())
    assert [count(b, 2) for b in run(resumed, 10)] == [0] * 8 + [10] * 2


def test_stats_count_each_source(three):
    loader = mix(three, 10, on_exhausted="cycle", weights={"web": 0.5, "code": 0.5}, steps=4)
    assert len(run(loader)) == len(loader) == 4
    sources = loader.stats()["sources"]
    assert sources["web"]["samples"] == sources["code"]["samples"] == 20
    assert sources["math"]["samples"] == 0
    assert sources["web"]["bytes"] == sources["web"]["samples"] * 24


def test_sources_that_disagree_are_refused_naming_both(three, tmp_path):
    odd = tmp_path / "odd.npy"
    np.save(odd, np.zeros((10, 4), np.int64))
    with pytest.raises(pinfeed.PinfeedValueError, match="'web' .*'odd'.* shape and dtype"):
        mix({**three, "odd": str(odd)}, 10, weights={"web": 1.0, "odd": 1.0})
    narrow = tmp_path / "narrow.npy"
    np.save(narrow, np.zeros((10, 3), np.int32))
    with pytest.raises(pinfeed.PinfeedValueError, match="'narrow'"):
        mix({**three, "narrow": str(narrow)}, 10)
    with pytest.raises(pinfeed.PinfeedValueError, match="epochs=1"):
        mix(three, 10, epochs=2)
    with pytest.raises(pinfeed.PinfeedValueError, match="block"):
        mix(three, 10, shuffle="block")
    with pytest.raises(pinfeed.PinfeedTypeError, match="token_dtype"):
        mix({"web": pinfeed.Source(three["web"], token_dtype="uint16")}, 10, weights={"web": 1})
    with pytest.raises(pinfeed.PinfeedTypeError, match="not shape"):
        pinfeed.Source(three["web"], shape=(3,))
