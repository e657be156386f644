"""TokenLoader mixtures carry several steps a Loader batch (issue 49), and every step still
holds exactly the windows the Loader of one step a batch over the same blend gives its rank:
on every rank, resumed inside a group, resumed elastically across a group's end, in a tail
group and in a short last step. On the host backend.

Source ``s`` holds uint16 tokens ``s * 20000 + t``, so a window's first token says which
source it came from and where.
"""

import itertools

import numpy as np
import pytest

import pinfeed
from pinfeed import TokenLoader

pytestmark = pytest.mark.usefixtures("no_launcher_env")

SEQ = 4
BASE = 20000
NAMES = ("web", "code", "math")
SHARES = {"web": 0.5, "code": 0.3, "math": 0.2}
SMALL = dict(device="cpu", pinned_budget="256KiB", num_threads=2)
BATCH = 2  # 10 tokens a step: 16 steps a Loader batch
GROUP = 16

CASES = {
    # 37 steps: two whole groups and a tail group of 5 steps.
    "random-exact": dict(sample="random", steps=37),
    "random-sampled": dict(sample="random", mode="sampled", steps=37),
    # The epoch ends where a source runs out: a tail group, and a short last step where the
    # world size does not divide the samples left.
    "sequential-stop": dict(sample="sequential", shuffle=True),
    "sequential-policies": dict(
        sample="sequential",
        on_exhausted={"web": "cycle", "code": {"passes": 2}, "math": {"samples": 30}},
    ),
    "sequential-drop-last": dict(sample="sequential", drop_last=True),
    "sequential-steps": dict(sample="sequential", on_exhausted="cycle", steps=21),
    # New weights from inside the second group.
    "random-curriculum": dict(sample="random", steps=37, weights=[(0, SHARES), (20, {"math": 1})]),
}


@pytest.fixture
def three(tmp_path):
    """Three raw token files of 149, 201 and 81 tokens: 37, 50 and 20 sequential windows."""
    sources = {}
    for s, (name, n) in enumerate(zip(NAMES, (149, 201, 81))):
        path = tmp_path / f"{name}.bin"
        (s * BASE + np.arange(n)).astype(np.uint16).tofile(path)
        sources[name] = pinfeed.Source(path, token_dtype="uint16")
    return sources


def mix(sources, case, rank=0, world=1):
    kw = {"weights": SHARES, **CASES[case]}
    return TokenLoader(sources, SEQ, BATCH, seed=3, rank=rank, world_size=world, **SMALL, **kw)


def windows(first_tokens):
    """(source, place) of each window, from its first tokens."""
    return [(int(t) // BASE, int(t) % BASE) for t in first_tokens]


def run(loader, steps=None):
    """The steps of one iteration (its first ``steps``), as window lists."""
    return [windows(np.asarray(x)[:, 0]) for x, _ in itertools.islice(loader, steps)]


def one_step_a_batch(sources, case, rank, world, state=None, steps=None, reweighted=None):
    """What the mixture delivered before its steps were grouped: the Loader of one step a batch
    over epoch 0's blend (of a twin TokenLoader, given the ``reweighted`` arguments of
    ``set_weights`` first, or the schedule of ``state``), at ``rank`` of ``world``, from
    ``state``; and that Loader, after its first ``steps`` batches."""
    twin = mix(sources, case, rank, world)
    if state is not None:
        twin.load_state_dict(state)
    if reweighted is not None:
        twin.set_weights(*reweighted)
    blend = twin._mixture.open(0)[0]
    drop_last = CASES[case].get("drop_last", False)
    loader = pinfeed.Loader(
        blend, BATCH, raw=True, seed=3, rank=rank, world_size=world, drop_last=drop_last, **SMALL
    )
    if state is not None:
        loader.load_state_dict(state)
    got = [windows(np.asarray(b).view("<u2")[:, 0]) for b in itertools.islice(loader, steps)]
    return got, loader


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_every_step_on_every_rank_holds_the_windows_of_one_step_a_batch(three, case, world):
    tails = set()
    for rank in range(world):
        loader = mix(three, case, rank, world)
        assert loader._mixed_group == GROUP
        grouped = run(loader)
        want, reference = one_step_a_batch(three, case, rank, world)
        assert grouped == want, rank
        tails.add(len(grouped) % GROUP)
        if CASES[case]["sample"] == "sequential":
            assert len(loader) == len(reference) == len(grouped)
    assert tails != {0}  # a tail group: the steps do not fill the last Loader batch


def test_a_short_last_step_in_a_tail_group(three):
    # 3 ranks do not divide the samples of the epoch: the last step is short and padded from
    # the epoch's start, as with one step a batch.
    for rank in range(3):
        grouped = run(mix(three, "sequential-stop", rank, 3))
        assert len(grouped) % GROUP != 0
        assert len(grouped[-1]) < BATCH
        assert grouped == one_step_a_batch(three, "sequential-stop", rank, 3)[0]


@pytest.mark.parametrize("case", ["random-sampled", "sequential-stop"])
def test_a_resume_inside_a_group_gives_the_rest_and_the_state_of_one_step_a_batch(three, case):
    whole = run(mix(three, case))
    # The epoch's last step taken, the state is the next epoch's start, as a Loader's.
    for k in (1, GROUP - 1, GROUP, GROUP + 1, GROUP + 7, len(whole) - 1, len(whole)):
        first = mix(three, case)
        head = run(first, k)
        state = first.state_dict()
        # The state the Loader of one step a batch has after the same steps.
        _, reference = one_step_a_batch(three, case, 0, 1, steps=k)
        want = reference.state_dict()
        assert {key: state[key] for key in want} == want, k
        assert (state["epoch"], state["batches_done"]) == divmod(k, len(whole)), k
        again = mix(three, case)
        again.load_state_dict(state)
        assert head + run(again) == whole if k < len(whole) else run(again) != whole, k


@pytest.mark.parametrize("case", ["random-sampled", "sequential-policies"])
@pytest.mark.parametrize("w_from,w_to", list(itertools.product((1, 2, 3), repeat=2)))
def test_an_elastic_resume_across_a_group_boundary_is_that_of_one_step_a_batch(
    three, case, w_from, w_to
):
    first = [mix(three, case, r, w_from) for r in range(w_from)]
    for loader in first:
        run(loader, GROUP + 1)  # one step into the second group
    state = first[0].state_dict()
    assert state["batches_done"] == GROUP + 1
    for rank in range(w_to):
        again = mix(three, case, rank, w_to)
        again.load_state_dict(state)
        want, _ = one_step_a_batch(three, case, rank, w_to, state=state)
        assert run(again) == want, rank


def test_new_weights_from_inside_a_group_are_those_of_one_step_a_batch(three):
    loader = mix(three, "random-exact")
    head = run(loader, GROUP + 3)
    loader.set_weights({"code": 1.0}, from_step=GROUP + 5)
    state = loader.state_dict()
    rest = run(loader)
    want, _ = one_step_a_batch(
        three, "random-exact", 0, 1, state=state, reweighted=({"code": 1.0}, GROUP + 5)
    )
    assert rest == want
    assert [sum(src == 1 for src, _ in step) for step in head + rest][GROUP + 5 :] == [BATCH] * (
        37 - GROUP - 5
    )
