"""framework="torch" | "jax" | "cupy" | "numpy" on the host backend (JAX's CPU build), and the
Stateful protocol of prefetch. The CUDA paths are in test_gpu_frameworks.py."""

import gc
import os
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest

import pinfeed
from pinfeed import _frameworks, _pinfeed

MEGATRON = Path(__file__).resolve().parents[3] / "crates/source/tests/fixtures/megatron"


def run_python(code, env=None):
    """Runs ``code`` in a fresh interpreter (for what must hold from the first import on)."""
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        check=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


@pytest.fixture(scope="module")
def jax():
    return pytest.importorskip("jax")


@pytest.fixture
def records(tmp_path):
    x = np.random.default_rng(3).random((1003, 6)).astype(np.float32)
    path = tmp_path / "x.npy"
    np.save(path, x)
    return path, x


def test_unknown_framework_and_conflicts_are_one_clear_line(records):
    path, _ = records
    with pytest.raises(pinfeed.PinfeedValueError, match="framework must be one of"):
        pinfeed.Loader(path, 10, device="cpu", framework="tensorflow")
    with pytest.raises(pinfeed.PinfeedValueError, match="give one of them"):
        pinfeed.Loader(path, 10, device="cpu", framework="numpy", as_torch=True)
    with pytest.raises(pinfeed.PinfeedValueError, match="framework must be one of"):
        pinfeed.to_device(np.zeros(3), device="cpu", framework=3)


def test_cupy_needs_cuda_or_says_it_is_missing(records):
    path, _ = records
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(pinfeed.PinfeedError, match="cupy is not installed"):
            pinfeed.Loader(path, 10, device="cpu", framework="cupy")
        return
    with pytest.raises(pinfeed.PinfeedValueError, match="framework='cupy' gives CUDA arrays"):
        pinfeed.Loader(path, 10, device="cpu", framework="cupy")


def test_numpy_framework_is_the_host_default(records):
    path, x = records
    for framework in (None, "numpy"):
        got = list(pinfeed.Loader(path, 100, device="cpu", framework=framework))
        assert all(type(b) is np.ndarray for b in got)
        np.testing.assert_array_equal(np.concatenate(got), x)


def test_exports_are_counted_by_their_release_stream_until_freed(records):
    # cupy_array keeps a CuPy stream alive while this counts exports on it; on the host
    # backend every export is released after "stream" 0. Other tests' arrays may be alive.
    path, x = records
    gc.collect()  # other tests' arrays caught in cycles go now, not during the count
    before = _pinfeed.streams_with_exports().get(0, 0)
    held = list(pinfeed.Loader(path, 100, device="cpu", framework="numpy"))
    assert _pinfeed.streams_with_exports().get(0, 0) == before + len(held)
    np.testing.assert_array_equal(np.concatenate(held), x)
    del held
    gc.collect()
    assert _pinfeed.streams_with_exports().get(0, 0) == before


def test_jax_batches_equal_the_source_in_every_order(records, jax):
    path, x = records
    for shuffle in (False, True, "block"):
        loader = pinfeed.Loader(path, 64, device="cpu", framework="jax", shuffle=shuffle, seed=5)
        got = list(loader)
        assert all(isinstance(b, jax.Array) for b in got)
        assert {d for b in got for d in b.devices()} == {jax.devices("cpu")[0]}
        want = x[pinfeed.epoch_order(len(x), 64, shuffle=shuffle, seed=5).astype(np.int64)]
        np.testing.assert_array_equal(np.concatenate([np.asarray(b) for b in got]), want)


def test_held_jax_arrays_keep_their_memory(jax):
    # A small ring: its slots are reused many times while every batch is still held.
    x = np.arange(4000 * 256, dtype=np.int32).reshape(4000, 256)
    loader = pinfeed.Loader(x, 50, device="cpu", framework="jax", pinned_budget="1MiB")
    held = list(loader)
    assert len(held) == 80
    np.testing.assert_array_equal(np.concatenate([np.asarray(b) for b in held]), x)


def test_jax_array_is_a_view_of_the_buffer_and_frees_it_when_dropped(jax):
    stager = _pinfeed.Stager("cpu", 1 << 20, None)
    x = np.arange(4096, dtype=np.float32)
    buf = stager.upload(x, (2, 32, 1), [4096])
    arr = _frameworks.jax_array(buf)
    assert buf.exported
    np.testing.assert_array_equal(np.asarray(arr), x)
    # The host backend's buffers are 64-byte aligned, which JAX's CPU client wraps as they are.
    assert buf.address % 64 == 0 and arr.unsafe_buffer_pointer() == buf.address
    del arr  # the capsule's deleter gives the memory back; nothing to observe but no crash


def test_jax_refuses_64_bit_batches_it_would_narrow(tmp_path, jax):
    if jax.config.jax_enable_x64:
        pytest.skip("jax_enable_x64 is on")
    path = tmp_path / "i64.npy"
    np.save(path, np.arange(100, dtype=np.int64))
    with pytest.raises(pinfeed.PinfeedValueError, match=r"i64.npy: JAX would turn the int64"):
        pinfeed.Loader(path, 10, device="cpu", framework="jax")
    # The bytes, or a 32-bit dtype, go through.
    raw = list(pinfeed.Loader(path, 10, device="cpu", framework="jax", raw=True))
    assert raw[0].dtype == np.uint8 and raw[0].shape == (10, 8)
    with pytest.raises(pinfeed.PinfeedValueError, match="JAX would turn the float64"):
        pinfeed.to_device(np.zeros(3), device="cpu", framework="jax")


def test_jax_x64_delivers_64_bit_batches(tmp_path):
    pytest.importorskip("jax")
    path = tmp_path / "i64.npy"
    np.save(path, np.arange(100, dtype=np.int64) << 40)
    run_python(
        f"""
        import jax, numpy as np, pinfeed
        jax.config.update("jax_enable_x64", True)
        got = list(pinfeed.Loader({str(path)!r}, 10, device="cpu", framework="jax"))
        assert got[0].dtype == np.int64
        np.testing.assert_array_equal(np.concatenate(got), np.load({str(path)!r}))
        """
    )


def test_no_torch_import_on_the_jax_numpy_paths(records):
    pytest.importorskip("jax")
    path, _ = records
    # A finder that records (and refuses) any import of torch: the test fails whether or not
    # torch is installed, if anything on these paths asks for it.
    run_python(
        f"""
        import sys
        asked = []
        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    asked.append(name)
                    raise ImportError("torch refused by the test")
        sys.meta_path.insert(0, NoTorch())
        import numpy as np, jax, pinfeed
        for fw in ("jax", "numpy"):
            list(pinfeed.Loader({str(path)!r}, 100, device="cpu", framework=fw, shuffle=True))
            list(pinfeed.prefetch([{{"a": np.ones((3, 2), np.float32)}}], device="cpu", framework=fw))
            pinfeed.to_device(np.ones(5, np.int32), device="cpu", framework=fw)
        m = pinfeed.MultiLoader({str(path)!r}, 100, devices=["cpu", "cpu"], framework="jax")
        list(m)
        assert not asked and "torch" not in sys.modules, asked
        """
    )


def test_prefetch_and_to_device_give_jax_arrays(jax):
    items = [
        {"x": np.full((i + 1, 3), i, np.float32), "y": (np.arange(i, dtype=np.int32), "s")}
        for i in range(3)
    ]
    got = list(pinfeed.prefetch(items, device="cpu", framework="jax"))
    for want, item in zip(items, got):
        assert isinstance(item["x"], jax.Array) and item["y"][1] == "s"
        np.testing.assert_array_equal(np.asarray(item["x"]), want["x"])
        np.testing.assert_array_equal(np.asarray(item["y"][0]), want["y"][0])
    one = pinfeed.to_device(np.arange(10, dtype=np.uint16), device="cpu", framework="jax")
    assert isinstance(one, jax.Array)
    np.testing.assert_array_equal(np.asarray(one), np.arange(10, dtype=np.uint16))


def test_token_loader_jax_matches_numpy(jax):
    data = np.random.default_rng(1).integers(0, 1 << 16, 5000, dtype=np.uint16)
    common = dict(device="cpu", rank=0, world_size=1)
    for name in ("uint16", "int32"):
        tokens = np.load(MEGATRON / f"{name}_tokens.npy")
        for sample in ("sequential", "documents", "random"):
            kw = dict(steps=3) if sample == "random" else dict(drop_last=True)
            path = MEGATRON / f"{name}.bin"
            ref = pinfeed.TokenLoader(path, 8, 2, sample=sample, dtype="int32", **kw, **common)
            got = pinfeed.TokenLoader(path, 8, 2, sample=sample, framework="jax", **kw, **common)
            assert got.dtype == "int32"  # jax_enable_x64 is off
            pairs = list(zip(ref, got))
            assert pairs and len(tokens)
            for want, have in pairs:
                assert all(isinstance(a, jax.Array) for a in have)
                for a, b in zip(want, have):
                    np.testing.assert_array_equal(a, np.asarray(b))
    del data


def test_token_loader_torch_and_numpy_on_the_host_match_the_default():
    common = dict(device="cpu", rank=0, world_size=1)
    frameworks = ["numpy"]
    try:
        import torch  # noqa: F401

        frameworks.append("torch")
    except ImportError:
        pass
    for sample in ("sequential", "documents", "random"):
        kw = dict(steps=3) if sample == "random" else dict(drop_last=True)
        path = MEGATRON / "uint16.bin"
        ref = list(pinfeed.TokenLoader(path, 8, 2, sample=sample, **kw, **common))
        assert ref
        for fw in frameworks:
            got = list(pinfeed.TokenLoader(path, 8, 2, sample=sample, framework=fw, **kw, **common))
            assert len(got) == len(ref)
            for want, have in zip(ref, got):
                for a, b in zip(want, have):
                    assert type(b).__module__.split(".")[0] == fw and str(b.dtype).endswith(
                        str(a.dtype)
                    )
                    np.testing.assert_array_equal(a, np.asarray(b))


def test_multiloader_assembles_a_sharded_global_array(records):
    pytest.importorskip("jax")
    path, x = records
    # Four CPU devices (XLA's flag must be set before jax starts): blocks 0..3 of each step.
    run_python(
        f"""
        import jax, numpy as np, pinfeed
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        devices = jax.devices("cpu")
        assert len(devices) == 4
        # The mesh in another order than the devices' ids: the blocks follow the mesh.
        mesh = Mesh(np.array(devices[::-1]), ("data",))
        sharding = NamedSharding(mesh, P("data"))
        x = np.load({str(path)!r})
        multi = pinfeed.MultiLoader({str(path)!r}, 25, sharding=sharding, shuffle=True, seed=2)
        steps = list(multi)
        assert len(steps) == len(multi)
        orders = [pinfeed.epoch_order(len(x), 25, rank=r, world_size=4, shuffle=True, seed=2)
                  for r in range(4)]
        batch = lambda r, i: x[orders[r][i * 25 : (i + 1) * 25].astype(np.int64)]
        for i, g in enumerate(steps):
            assert isinstance(g, jax.Array) and g.sharding == sharding
            want = np.concatenate([batch(r, i) for r in range(4)])
            np.testing.assert_array_equal(np.asarray(g), want)
            for shard in g.addressable_shards:
                k = shard.index[0].start // len(batch(0, i))
                assert shard.device == mesh.devices[k]
                np.testing.assert_array_equal(np.asarray(shard.data), batch(k, i))
        # Replicated: every device holds the one batch.
        rep = NamedSharding(mesh, P())
        multi = pinfeed.MultiLoader({str(path)!r}, 100, sharding=rep, replicate=True)
        got = np.concatenate([np.asarray(g) for g in multi])
        np.testing.assert_array_equal(got, x)
        for bad in (NamedSharding(mesh, P(None, "data")),):
            try:
                pinfeed.MultiLoader({str(path)!r}, 100, sharding=bad)
            except pinfeed.PinfeedValueError as e:
                assert "of the batch axis" in str(e) or "cut the batch axis" in str(e), e
            else:
                raise AssertionError("a sharding of another axis was accepted")
        try:
            pinfeed.MultiLoader({str(path)!r}, 100, sharding=sharding, replicate=True)
        except pinfeed.PinfeedValueError as e:
            assert "fully replicated" in str(e), e
        else:
            raise AssertionError("replicate=True took a split sharding")
        """,
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"},
    )


def test_gpu_resident_shuffle_refuses_jax(records, jax):
    path, _ = records
    with pytest.raises(pinfeed.PinfeedValueError, match='shuffle="gpu" gathers'):
        pinfeed.Loader(path, 10, device="cpu", framework="jax", shuffle="gpu")


class Counter:
    """A small stateful iterable (the Stateful protocol: state_dict/load_state_dict), as a
    torchdata StatefulDataLoader is: its state says how many items it has produced."""

    def __init__(self, n):
        self.n, self.start, self.produced = n, 0, 0

    def __iter__(self):
        self.produced = self.start
        for i in range(self.start, self.n):
            self.produced = i + 1
            yield np.full(4, i, np.int64)
        self.start = 0

    def state_dict(self):
        return {"produced": self.produced}

    def load_state_dict(self, state):
        self.start = state["produced"]


def test_prefetch_state_counts_only_received_items():
    counter = Counter(40)
    p = pinfeed.prefetch(counter, device="cpu", prefetch=4)
    assert p.state_dict() == {"produced": 0}
    seen = [int(next(p)[0]) for _ in range(5)]
    # The iterable ran ahead (depth 4 and the queues), the state did not.
    deadline = __import__("time").monotonic() + 5
    while counter.produced < 9 and __import__("time").monotonic() < deadline:
        pass
    assert counter.produced > 5
    state = p.state_dict()
    assert state == {"produced": 5} and seen == [0, 1, 2, 3, 4]
    p.close()
    resumed = pinfeed.prefetch(Counter(40), device="cpu")
    resumed.load_state_dict(state)
    rest = [int(b[0]) for b in resumed]
    assert rest == list(range(5, 40))


def test_prefetch_of_a_loader_resumes_exactly(records):
    path, x = records
    loader = pinfeed.Loader(path, 50, device="cpu", shuffle=True, seed=9)
    p = pinfeed.prefetch(loader, device="cpu", prefetch=3)
    first = [next(p) for _ in range(7)]
    state = p.state_dict()
    assert state["batches_done"] == 7 and state["epoch"] == 0
    p.close()
    fresh = pinfeed.Loader(path, 50, device="cpu", shuffle=True, seed=9)
    q = pinfeed.prefetch(fresh, device="cpu")
    q.load_state_dict(state)
    rest = list(q)
    order = pinfeed.epoch_order(len(x), 50, shuffle=True, seed=9).astype(np.int64)
    np.testing.assert_array_equal(np.concatenate(first + rest), x[order])
    assert zlib.crc32(np.concatenate(first + rest)[np.argsort(order)]) == zlib.crc32(x)


def test_prefetch_of_a_plain_iterable_has_no_state():
    p = pinfeed.prefetch([np.zeros(2)], device="cpu")
    with pytest.raises(TypeError, match="has no state_dict/load_state_dict"):
        p.state_dict()
    p.close()
