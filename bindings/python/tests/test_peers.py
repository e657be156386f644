"""bench/peers.py (issue 52) on the host backend at a small size: every peer that installs here
(requirements-dev.txt pins them) gets through its rows, its batches checked against the source,
so that a peer's changed API or a broken harness fails here rather than on the GPU machine. A
peer is skipped only with its reason: not installed here, or a CUDA device needed. The figures
are the GPU machine's to take; this test reads none of them."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
# The modules each peer needs; the rows of one that is not installed may be skipped, and say so.
NEEDS = {
    "litdata": "litdata",
    "mosaic": "streaming",
    "webdataset": "webdataset",
    "torchdata": "torchdata",
    "megatron": "megatron",
    "spdl": "spdl.pipeline",
    "dali": "nvidia.dali",
}
# Skips whatever is installed: what the host backend cannot do, or the peer cannot, or what the
# harness does not drive yet.
ALWAYS = ("needs a CUDA device", "draws random windows only", "always shuffles", "no DALI pipeline")


def installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is not there
        return False


def images(root, count=48):
    """An ImageFolder of small JPEGs in three classes, a grayscale and a CMYK one among them."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        h, w = rng.integers(160, 320, 2)
        pixels = np.linspace(0, 255, w)[None, :, None] + rng.integers(0, 60, (h, w, 3))
        image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
        image = image.convert({5: "L", 7: "CMYK"}.get(i % 12, "RGB"))
        image.save(folder / f"{i:05d}.JPEG", quality=85)
    return root


def test_every_installed_peer_runs_its_rows_and_checks_them(tmp_path):
    pytest.importorskip("torchvision")
    out = tmp_path / "peers.json"
    args = [
        "--device", "cpu", "--data", str(tmp_path / "data"), "--tokens-gb", "0.004",
        "--shapes", "4x256", "--record-count", "3000", "--record-batch", "64",
        "--images", str(images(tmp_path / "images")), "--image-batch", "8",
        "--workers", "2", "--batches", "2", "--warmup", "1", "--min-seconds", "0",
        "--timeout", "300", "--out", str(out),
    ]  # fmt: skip
    run = subprocess.run(
        [sys.executable, str(BENCH / "peers.py"), "run", *args],
        capture_output=True, text=True, timeout=900, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    seen = {(r["workload"], r["peer"]) for r in rows}
    for workload, peers in [
        ("tokens", ["nanogpt", "megatron", "litdata", "mosaic", "pinfeed"]),
        ("images", ["dataloader", "webdataset", "litdata", "mosaic", "torchvision-gpu",
                    "spdl", "dali", "pinfeed", "pinfeed-gpu"]),
        ("records", ["dataloader", "torchdata", "litdata", "mosaic", "pinfeed"]),
    ]:  # fmt: skip
        assert {(workload, p) for p in peers} <= seen
    for r in rows:
        name = f"{r['workload']} {r.get('order', '')} {r['peer']}"
        assert "error" not in r, f"{name}: {r['error']}\n{r.get('traceback', '')}"
        if "skipped" in r:
            module = NEEDS.get(r["peer"])
            missing = module is not None and not installed(module)
            assert missing or any(why in r["skipped"] for why in ALWAYS), (
                f"{name} skipped though it is installed: {r['skipped']}"
            )
            continue
        assert r["checked_batches"] >= 2, name
        assert r["samples_per_s"] > 0 and r["peak_rss_mib"] > 0 and r["first_batch_s"] > 0
        assert r["version"] and r["settings"], name
    # SPDL's pipeline (spdl_core, pure Python) runs here on its Pillow path, spdl.io's nvJPEG
    # needing a CUDA device.
    if installed("spdl.pipeline"):
        (row,) = [r for r in rows if (r["workload"], r["peer"]) == ("images", "spdl")]
        assert "skipped" not in row and row["checked_batches"] >= 2, row
        assert row["settings"]["decode"].startswith("Pillow decode in SPDL pipeline threads")
    # The table names every row.
    assert run.stdout.count("\n") >= len(rows)


def bench_lib(name):
    """bench/lib/``name``, imported with bench/ on the path as `peers.py` imports it."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(f"lib.{name}")
    finally:
        sys.path.remove(str(BENCH))


def test_a_row_whose_batches_are_wrong_fails_its_check(tmp_path):
    record_checker = bench_lib("peers_records").checker
    token_checker = bench_lib("peers_tokens").checker
    corpus = tmp_path / "train.bin"
    tokens = np.random.default_rng(0).integers(0, 50257, 20000, dtype=np.uint16)
    tokens.tofile(corpus)
    x = np.stack([tokens[100:164], tokens[164:228]]).astype(np.int64)
    y = np.stack([tokens[101:165], tokens[165:229]]).astype(np.int64)
    token_checker(str(corpus), "documents")((x, y))
    with pytest.raises(AssertionError, match="not consecutive"):
        token_checker(str(corpus), "documents")((x[::-1].copy(), y[::-1].copy()))
    x[1, 5] ^= 1
    with pytest.raises(AssertionError):
        token_checker(str(corpus), "random")((x, y))
    records = np.random.default_rng(1).integers(0, 256, (500, 3, 31, 31), dtype=np.uint8)
    np.save(tmp_path / "records.npy", records)
    check = record_checker(str(tmp_path / "records.npy"), str(tmp_path))
    check(records[[7, 3, 400]].copy())
    changed = records[[7, 3]].copy()
    changed[1, 2, 30, 30] ^= 1
    with pytest.raises(AssertionError, match="record 1"):
        check(changed)


def test_a_row_that_hangs_says_where(tmp_path):
    # `peers.py one --stacks-after` dumps every thread's stack before `run`'s timeout kills
    # it; the timed-out row keeps the main thread's frames and the others' innermost.
    stacks = bench_lib("peers_run").stacks
    script = tmp_path / "hangs.py"
    script.write_text(
        "import faulthandler, threading, time\n"
        "faulthandler.dump_traceback_later(0.5, exit=False)\n"
        "def waits_in_a_worker():\n    time.sleep(30)\n"
        "threading.Thread(target=waits_in_a_worker, daemon=True).start()\n"
        "def waits_for_a_batch():\n    time.sleep(30)\n"
        "waits_for_a_batch()\n"
    )
    with pytest.raises(subprocess.TimeoutExpired) as e:
        subprocess.run([sys.executable, str(script)], capture_output=True, timeout=3)
    where = stacks(e.value.stderr)
    assert where["main"][0].endswith("in waits_for_a_batch"), where
    assert where["main"][-1].endswith("in <module>")
    assert [f for f in where["others"] if f.endswith("in waits_in_a_worker")], where
    assert stacks(b"a row that printed nothing") == {}


def test_the_noisy_neighbour_pairs_each_block_with_the_resident_block_of_its_turn():
    sys.path.insert(0, str(BENCH))
    try:
        from lib.peers_noisy import summarize
    finally:
        sys.path.remove(str(BENCH))
    # Each run a tenth slower than the resident run of its round.
    resident = [10.0, 20.0, 30.0]
    runs = {"resident": resident, "fed": [r / 0.9 for r in resident]}
    waits = {"resident": [0.0, 0.0, 0.0], "fed": [0.5, 0.1, 0.2]}
    rows = {r["feed"]: r for r in summarize(runs, {k: [1.0, 2.0, 3.0] for k in runs}, waits)}
    assert rows["resident"]["share_by_pairs_pct"] == 0
    row = rows["fed"]
    assert row["pairs_pct"] == pytest.approx([10.0, 10.0, 10.0])
    assert row["share_by_pairs_pct"] == pytest.approx(10.0)
    assert row["share_of_step_pct"] == pytest.approx(10.0)
    assert row["share_of_fastest_pct"] == pytest.approx(10.0)
    assert row["cpu_ms_per_step"] == 2.0
    assert row["next_ms_per_step"] == 0.2
    # Pairs and medians part where the host drifts: slower than the resident batch in one
    # round, faster in the other (a negative share).
    runs = {"resident": [10.0, 30.0], "fed": [12.0, 27.0]}
    zeros = {k: [0.0, 0.0] for k in runs}
    row = {r["feed"]: r for r in summarize(runs, zeros, zeros)}["fed"]
    assert row["pairs_pct"] == pytest.approx([100 * -3 / 27, 100 * 2 / 12])
    assert row["share_by_pairs_pct"] == pytest.approx((100 * -3 / 27 + 100 * 2 / 12) / 2)
    assert row["share_of_step_pct"] == pytest.approx(100 * (19.5 - 20) / 19.5)
