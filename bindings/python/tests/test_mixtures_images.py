"""ImageLoader mixtures (issue 49): a dict of image datasets, on the host backend.

Source ``s`` is WebDataset shards whose sample ``n`` has label ``s * 1000 + n``, so a label
says which source a crop came from and which sample it is.
"""

import io
import itertools
import tarfile
from pathlib import Path

import numpy as np
import pytest

import pinfeed

pytestmark = pytest.mark.usefixtures("no_launcher_env")

FIXTURES = Path(__file__).resolve().parents[3] / "crates/source/tests/fixtures/images"
JPEGS = ["baseline.jpg", "444.jpg", "grayscale.jpg", "cmyk.jpg"]
NAMES = ("web", "code", "math")
SHARES = {"web": 0.5, "code": 0.3, "math": 0.2}
ARGS = dict(size=8, device="cpu", num_threads=2)


def shards(root: Path, s: int, count: int) -> str:
    out = root / f"source{s}"
    out.mkdir()
    with tarfile.open(out / "s-0000.tar", "w") as tar:
        for n in range(count):
            for name, data in (
                (f"{n:05d}.jpg", (FIXTURES / JPEGS[n % len(JPEGS)]).read_bytes()),
                (f"{n:05d}.cls", str(s * 1000 + n).encode()),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(out)


@pytest.fixture
def three(tmp_path):
    """Three image sources of 25, 15 and 10 samples."""
    return {name: shards(tmp_path, s, n) for s, (name, n) in enumerate(zip(NAMES, (25, 15, 10)))}


def mix(sources, batch, **kw):
    kw.setdefault("weights", SHARES)
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    return pinfeed.ImageLoader(sources, batch, **ARGS, **kw)


def run(loader, steps=None):
    """Each step's (source, sample) pairs and images."""
    out = []
    for images, labels in itertools.islice(loader, steps):
        out.append(([(int(v) // 1000, int(v) % 1000) for v in labels], images.copy()))
    return out


def samples(batches):
    return [b for b, _ in batches]


def count(batch, s):
    return sum(1 for src, _ in batch if src == s)


def test_every_exact_step_holds_each_share(three):
    batches = samples(run(mix(three, 10, shuffle=True)))
    assert len(batches) == 5
    for step, b in enumerate(batches):
        assert [count(b, s) for s in range(3)] == [5, 3, 2], step
    # One pass of each: every sample once.
    for s, n in enumerate((25, 15, 10)):
        assert sorted(k for b in batches for src, k in b if src == s) == list(range(n))


def test_each_sample_comes_once_a_pass(three):
    loader = mix(
        three, 10, shuffle=True, on_exhausted={"web": "stop", "code": "cycle", "math": "cycle"}
    )
    loader.set_weights({"web": 0.2, "code": 0.4, "math": 0.4}, from_step=0)
    flat = [r for b in samples(run(loader)) for r in b]
    for s, n in enumerate((25, 15, 10)):
        seen = [k for src, k in flat if src == s]
        for k in range(0, len(seen), n):
            one_pass = seen[k : k + n]
            assert len(set(one_pass)) == len(one_pass), (s, k)
            if len(one_pass) == n:
                assert sorted(one_pass) == list(range(n)), (s, k)
    assert sorted(k for src, k in flat if src == 0) == list(range(25))


def test_resume_after_any_step_equals_the_uninterrupted_run(three):
    kw = dict(seed=4, shuffle=True)
    whole = run(mix(three, 4, **kw))
    for k in range(len(whole)):
        first = mix(three, 4, **kw)
        head = run(first, k)
        again = mix(three, 4, **kw)
        again.load_state_dict(first.state_dict())
        rest = run(again)
        assert samples(head + rest) == samples(whole), k
        for (_, got), (_, want) in zip(head + rest, whole):
            np.testing.assert_array_equal(got, want)  # the same crops


@pytest.mark.parametrize("w_from,w_to", list(itertools.product((1, 2, 3), repeat=2)))
def test_elastic_resume_gives_the_uninterrupted_global_sequence(three, w_from, w_to):
    kw = dict(seed=2, shuffle=True)

    def ranks(world):
        return [mix(three, 2, rank=r, world_size=world, **kw) for r in range(world)]

    def global_run(loaders, steps=None):
        per_rank = [samples(run(ld, steps)) for ld in loaders]
        return [r for step in zip(*per_rank) for b in step for r in b]

    whole = global_run(ranks(w_from))
    first = ranks(w_from)
    head = global_run(first, 3)
    state = first[0].state_dict()
    rest = ranks(w_to)
    for ld in rest:
        ld.load_state_dict(state)
    tail = global_run(rest)
    n = first[0].num_samples - len(head)
    assert head + tail[:n] == whole[: len(head) + n]
    if w_from == w_to:
        assert head + tail == whole  # the padding of the uninterrupted run too
    else:
        # What pads the last step repeats the start of the rest, never a consumed sample.
        assert set(tail[n:]) <= set(tail[:n])


def test_stats_and_refusals(three, tmp_path):
    loader = mix(three, 10)
    run(loader)
    sources = loader.stats()["sources"]
    assert [sources[n]["samples"] for n in NAMES] == [25, 15, 10]
    assert loader.stats()["skipped"] == 0
    assert len(loader.labels()) == 50
    with pytest.raises(pinfeed.PinfeedValueError, match="decode='cpu'"):
        mix(three, 10, decode="gpu")
    with pytest.raises(pinfeed.PinfeedValueError, match="object storage"):
        mix({**three, "far": "s3://bucket/shards/"}, 10)
    with pytest.raises(pinfeed.PinfeedTypeError, match="queue_depth"):
        mix({"web": pinfeed.Source(three["web"], queue_depth=4)}, 10, weights={"web": 1.0})
    with pytest.raises(pinfeed.PinfeedValueError, match="applies to a mixture"):
        pinfeed.ImageLoader(three["web"], 10, weights={"web": 1.0}, **ARGS)
