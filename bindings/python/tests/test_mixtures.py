"""TokenLoader mixtures (issue 49): proportions, exactly once a pass, resume, elastic resume,
curriculum, Megatron's rule and per-source stats, on the host backend.

Source ``s`` holds uint16 tokens ``s * 20000 + t``, so a window's first token says which
source it came from and where.
"""

import importlib.util
import itertools
from pathlib import Path

import numpy as np
import pytest

import pinfeed
from pinfeed import TokenLoader, _pinfeed

pytestmark = pytest.mark.usefixtures("no_launcher_env")

SEQ = 4
BASE = 20000
NAMES = ("web", "code", "math")
SHARES = {"web": 0.5, "code": 0.3, "math": 0.2}
SMALL = dict(device="cpu", pinned_budget="256KiB", num_threads=2)


@pytest.fixture
def three(tmp_path):
    """Three raw token files of 149, 201 and 81 tokens: 37, 50 and 20 sequential windows."""
    sources = {}
    for s, (name, n) in enumerate(zip(NAMES, (149, 201, 81))):
        path = tmp_path / f"{name}.bin"
        (s * BASE + np.arange(n)).astype(np.uint16).tofile(path)
        sources[name] = pinfeed.Source(path, token_dtype="uint16")
    return sources


def mix(sources, batch, **kw):
    kw.setdefault("weights", SHARES)
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    return TokenLoader(sources, SEQ, batch, **SMALL, **kw)


def windows(x):
    """(source, first token's place) of each row of a batch."""
    return [(int(t) // BASE, int(t) % BASE) for t in np.asarray(x)[:, 0]]


def run(loader, steps=None):
    """The batches of one iteration (its first ``steps``), as window lists."""
    return [windows(x) for x, _ in itertools.islice(loader, steps)]


def count(batch, s):
    return sum(1 for src, _ in batch if src == s)


def test_every_exact_step_holds_each_share(three):
    batches = run(mix(three, 10, steps=1000))
    assert len(batches) == 1000
    for step, b in enumerate(batches):
        assert [count(b, s) for s in range(3)] == [5, 3, 2], step


def test_sampled_shares_come_within_one_percent(three):
    batches = run(mix(three, 10, steps=1000, mode="sampled"))
    flat = [w for b in batches for w in b]
    for s, share in enumerate(SHARES.values()):
        assert abs(count(flat, s) / len(flat) - share) < 0.01, s
    assert any(count(b, 0) != 5 for b in batches)  # draws, not exact steps


def test_each_window_comes_once_a_pass(three):
    # "code" stops the epoch after its one pass; the others cycle, each pass in a new order.
    loader = mix(
        three,
        10,
        sample="sequential",
        shuffle=True,
        on_exhausted={"web": "cycle", "code": "stop", "math": "cycle"},
    )
    flat = [w for b in run(loader) for w in b]
    for s, n in enumerate((37, 50, 20)):
        places = [p // SEQ for src, p in flat if src == s]
        for k in range(0, len(places), n):
            one_pass = places[k : k + n]
            assert len(set(one_pass)) == len(one_pass), (s, k)
            if len(one_pass) == n:
                assert sorted(one_pass) == list(range(n)), (s, k)
        if len(places) >= 2 * n:
            assert places[:n] != places[n : 2 * n]
    assert len([1 for src, _ in flat if src == 1]) == 50


@pytest.mark.parametrize(
    "kw",
    [
        dict(sample="sequential", shuffle=True, on_exhausted="cycle"),
        dict(sample="random", mode="sampled"),
    ],
    ids=["sequential-exact", "random-sampled"],
)
def test_resume_after_any_step_equals_the_uninterrupted_run(three, kw):
    kw = dict(kw, seed=5, steps=12)
    whole = run(mix(three, 5, **kw))
    assert len(whole) == 12
    for k in range(12):
        first = mix(three, 5, **kw)
        head = run(first, k)
        state = first.state_dict()
        assert state["mixture"]["positions"] == {
            n: sum(count(b, s) for b in head) for s, n in enumerate(NAMES)
        }
        again = mix(three, 5, **kw)
        again.load_state_dict(state)
        assert head + run(again) == whole, k


def rank_loaders(sources, world, **kw):
    return [mix(sources, 3, rank=r, world_size=world, **kw) for r in range(world)]


def global_run(loaders, steps=None):
    """The global sequence of ``loaders`` (one a rank), step by step, rank by rank."""
    per_rank = [run(ld, steps) for ld in loaders]
    return [w for step in zip(*per_rank) for b in step for w in b]


ELASTIC = {
    "sequential-exact": dict(sample="sequential", shuffle=True, on_exhausted={"code": "stop"}),
    "random-sampled": dict(sample="random", mode="sampled", steps=20),
}


@pytest.mark.parametrize("how", list(ELASTIC))
@pytest.mark.parametrize("w_from,w_to", list(itertools.product((1, 2, 3), repeat=2)))
def test_elastic_resume_gives_the_uninterrupted_global_sequence(three, w_from, w_to, how):
    kw = dict(ELASTIC[how], seed=2)
    whole = global_run(rank_loaders(three, w_from, **kw))
    first = rank_loaders(three, w_from, **kw)
    head = global_run(first, 4)
    state = first[0].state_dict()
    rest = rank_loaders(three, w_to, **kw)
    for ld in rest:
        ld.load_state_dict(state)
    tail = global_run(rest)
    # The epoch's samples, before what pads its last step (which depends on the world size).
    n = first[0]._loader.num_samples - len(head)
    assert head + tail[:n] == whole[: len(head) + n]
    if w_from == w_to:
        assert head + tail == whole  # the padding of the uninterrupted run too
    else:
        # What pads the last step repeats the start of the rest, never a consumed sample.
        assert set(tail[n:]) <= set(tail[:n])


def test_a_curriculum_survives_a_resume_across_its_step(three):
    plan = [(0, {"web": 0.5, "code": 0.5}), (6, {"web": 0.9, "code": 0.1})]
    kw = dict(steps=10)
    whole = run(mix(three, 10, weights=plan, **kw))
    assert [count(b, 0) for b in whole] == [5] * 6 + [9] * 4
    first = mix(three, 10, weights=plan, **kw)
    head = run(first, 3)
    state = first.state_dict()
    # A loader made with the first weights only takes the schedule from the state.
    again = mix(three, 10, weights=plan[0][1], **kw)
    again.load_state_dict(state)
    assert head + run(again) == whole
    # set_weights changes the schedule from a step on, and the state keeps it.
    later = mix(three, 10, weights=plan[0][1], **kw)
    later.set_weights({"math": 1.0}, from_step=8)
    saved = later.state_dict()
    resumed = mix(three, 10, weights=plan[0][1], **kw)
    resumed.load_state_dict(saved)
    assert [count(b, 2) for b in run(resumed)] == [0] * 8 + [10] * 2
    # A step already begun keeps the weights it was drawn by.
    with pytest.raises(pinfeed.PinfeedValueError, match="the loader is at step 3"):
        first.set_weights({"math": 1.0}, from_step=2)


def megatron_helpers():
    """megatron-core's compiled helpers (``megatron/core/datasets/helpers_cpp*.so``) where
    megatron-core is installed, loaded alone: importing ``megatron.core`` imports torch."""
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        for path in sorted(Path(root, "core", "datasets").glob("helpers_cpp*.so")):
            found = importlib.util.spec_from_file_location("helpers_cpp", path)
            module = importlib.util.module_from_spec(found)
            found.loader.exec_module(module)
            return module
    return None


def blend_of(counts):
    """Our blend of one step holding ``counts`` samples of each source."""
    n = len(counts)
    blend = _pinfeed.Blend(
        [str(s) for s in range(n)],
        [10] * n,
        weights=[(0, [float(c) for c in counts])],
        exhausted=["cycle"] * n,
        step=sum(counts),
        samples_per_epoch=sum(counts),
    )
    mixture = blend.mixture([_one_window_source(n)] * n, 0, False)
    return [s for s, _ in mixture.locate(0, sum(counts))]


def _one_window_source(_):
    return _pinfeed.Source.from_array(np.zeros((10, 2), np.uint8), "'|u1'")


def transcribed_exhaustive(sizes):
    """megatron-core's build_exhaustive_blending_indices (datasets/helpers.cpp), line by line."""
    total = sum(sizes)
    weights = [s / total for s in sizes]
    counts, unspent, out, i = [0] * len(sizes), set(range(len(sizes))), [], 0
    while unspent:
        x = max(float(i), 1.0)
        best, error_max = -1, -np.inf
        for d in sorted(unspent):
            error = weights[d] * x - counts[d]
            if error > error_max:
                best, error_max = d, error
        out.append(best)
        counts[best] += 1
        if sizes[best] - counts[best] == 0:
            unspent.discard(best)
        i += 1
    return out


def test_a_step_is_megatrons_blend():
    """Each step's order is megatron-core's ``build_exhaustive_blending_indices`` (what
    ``BlendedDataset`` runs for sample counts) of the step's counts, and for 0.5/0.3/0.2 its
    ``build_blending_indices`` (weights and a size). Compared with megatron-core's compiled
    helpers where megatron-core is installed (it installs without a GPU: ``pip install
    --no-deps megatron-core``), otherwise with a transcription of helpers.cpp."""
    helpers = megatron_helpers()
    rng = np.random.default_rng(0)
    for _ in range(50):
        sizes = [int(v) for v in rng.integers(1, 30, int(rng.integers(1, 5)))]
        ours = blend_of(sizes)
        if helpers is None:
            assert ours == transcribed_exhaustive(sizes), sizes
            continue
        index = np.zeros(sum(sizes), np.int16)
        sample = np.zeros(sum(sizes), np.int64)
        helpers.build_exhaustive_blending_indices(
            index, sample, np.array(sizes, np.int64), len(sizes)
        )
        assert ours == index.tolist(), sizes
    if helpers is not None:
        index = np.zeros(1000, np.int16)
        sample = np.zeros(1000, np.int64)
        helpers.build_blending_indices(index, sample, np.array([0.5, 0.3, 0.2]), 3, 1000, False)
        assert blend_of([500, 300, 200]) == index.tolist()


def test_stats_count_each_source(three):
    loader = mix(three, 10, steps=20)
    run(loader)
    stats = loader.stats()["sources"]
    assert [stats[n]["samples"] for n in NAMES] == [100, 60, 40]
    assert stats["code"]["tokens"] == 60 * SEQ
    assert stats["code"]["bytes"] == 60 * (SEQ + 1) * 2
    assert all(stats[n]["read_time"] >= 0 for n in NAMES)


def test_bad_mixtures_are_refused_by_name(three, tmp_path):
    with pytest.raises(pinfeed.PinfeedValueError, match="'books'"):
        mix(three, 10, steps=5, weights={"books": 1.0})
    with pytest.raises(pinfeed.PinfeedValueError, match="mixture"):
        mix(three, 10, weights=None)
    with pytest.raises(pinfeed.PinfeedValueError, match="on_exhausted"):
        mix(three, 10, steps=5, on_exhausted={"web": "again"})
    wide = tmp_path / "wide.bin"
    np.arange(100, dtype=np.uint64).tofile(wide)
    signed = tmp_path / "signed.bin"
    np.arange(100, dtype=np.int8).tofile(signed)
    both = {
        "a": pinfeed.Source(wide, token_dtype="uint64"),
        "b": pinfeed.Source(signed, token_dtype="int8"),
    }
    with pytest.raises(pinfeed.PinfeedValueError, match="uint64 and signed"):
        mix(both, 10, steps=5, weights={"a": 1.0, "b": 1.0})
    with pytest.raises(pinfeed.PinfeedValueError, match="applies to a mixture"):
        TokenLoader(str(wide), SEQ, 10, token_dtype="uint64", weights={"a": 1.0}, **SMALL)


def test_sources_of_different_widths_are_widened(three, tmp_path):
    # A uint32 source beside uint16 ones: every window is read as uint32, values unchanged.
    wide = tmp_path / "wide.bin"
    (4 * BASE + np.arange(81)).astype(np.uint32).tofile(wide)  # above 65535
    sources = {**three, "wide": pinfeed.Source(wide, token_dtype="uint32")}
    loader = mix(sources, 10, steps=30, weights={**SHARES, "wide": 0.5})
    assert loader.token_dtype == np.dtype("<u4")
    seen = set()
    for x, y in loader:
        # Each window is consecutive tokens of one source, the uint32 ones above 65535 too.
        assert (np.diff(x, axis=1) == 1).all() and (y[:, -1] == x[:, -1] + 1).all()
        seen.update(src for src, _ in windows(x))
    assert seen == {0, 1, 2, 4}


def test_a_read_bound_explanation_names_a_source(three):
    loader = mix(three, 10, steps=20)
    run(loader)
    # The explanation a read-bound pass would give, as the mixture completes it (which
    # source, if any, is named is Rust's rule: holding_back, tested there).
    held = loader._mixture.current.holding_back()
    bound = {"bottleneck": "read-bound", "explanation": "read-bound: ..."}
    named = loader._mixture.stats(bound)["explanation"]
    assert named == ("read-bound: ..." if held is None else f"read-bound: ...; {held}")
    other = {"bottleneck": "consumer-bound", "explanation": "consumer-bound: ..."}
    assert loader._mixture.stats(other)["explanation"] == "consumer-bound: ..."
    sources = loader.stats()["sources"]
    assert all(sources[n]["wait_time"] == 0.0 for n in NAMES)  # local files


def test_new_weights_that_move_the_epochs_end_resume(three):
    # Sequential windows end the epoch when a source runs out, so new weights move its end:
    # the saved position (before the change) still holds in the new blend.
    loader = mix(three, 5, sample="sequential")
    head = run(loader, 2)
    loader.set_weights({"web": 1.0}, from_step=4)
    again = mix(three, 5, sample="sequential")
    again.load_state_dict(loader.state_dict())
    rest = run(again)
    assert run(loader) == rest
    assert all(count(b, 0) == 5 for b in rest[2:])
    assert len(head) + len(rest) != len(run(mix(three, 5, sample="sequential")))
