"""The benchmark modes the GPU machine runs for the loader's speed on each host
(`bench/records.py ab`, `threads`, `pipeline` and `parquet`, `bench/tokens.py text`), run here on
the host backend at small sizes (``--device cpu``): each gets through every row to its table and
result file, the check each row makes before it is timed catches a changed byte, and the turns
that `ab` runs builds in keep the rows of the runs that finished. The workload scripts refuse a
mode they do not have. The figures are the GPU machine's to take (docs/BENCHMARKS.md); these
tests read none of them."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pinfeed

BENCH = Path(__file__).resolve().parents[3] / "bench"
AB_ROWS = [
    "seed tensor: to_device(a)",
    "4 GiB .npy, shuffle=none",
    "4 GiB .npy, shuffle=random",
    "1 MiB batches from a host array",
    "4 GiB .npy, shuffle=gpu (epochs)",
]
# Rows timed in batches a second, with no bus to be a share of.
AB_TOKEN_ROWS = ["tokens 12x1024, random windows", "tokens 64x4096, random windows"]


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    """6,000 records of 3x31x31 bytes, the benchmark file's record at a small count."""
    path = tmp_path_factory.mktemp("bench") / "records.npy"
    rng = np.random.default_rng(1)
    np.save(path, rng.integers(0, 256, size=(6000, 3, 31, 31), dtype=np.uint8))
    return path


def script(workload, mode, *args, cwd):
    """Runs `bench/WORKLOAD.py MODE ARGS...` with this interpreter; the finished process."""
    return subprocess.run(
        [sys.executable, str(BENCH / workload), mode, *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        check=False,
    )


def run(mode, *args, cwd):
    """Runs a mode of bench/records.py; its stdout, or the test fails with its stderr."""
    out = script("records.py", mode, *args, cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def load_ab():
    """bench/lib/ab.py as a module (it imports only the standard library at its top)."""
    spec = importlib.util.spec_from_file_location("bench_ab", BENCH / "lib" / "ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    return ab


def test_ab_runs_every_row_of_both_builds(npy, tmp_path):
    # Each build is a folder put on PYTHONPATH; empty ones leave the installed pinfeed to both.
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    out = tmp_path / "ab.json"
    args = ["--build", f"one={tmp_path / 'one'}", "--build", f"two={tmp_path / 'two'}"]
    args += ["--rounds", "1", "--npy", str(npy), "--device", "cpu", "--small", "--out", str(out)]
    stdout = run("ab", *args, cwd=tmp_path)
    assert "FAILED" not in stdout
    rows = json.loads(out.read_text())
    assert sorted((x["build"], x["name"]) for x in rows) == sorted(
        (b, n) for b in ["one", "two"] for n in AB_ROWS + AB_TOKEN_ROWS
    )
    for x in rows:
        if x["name"] in AB_TOKEN_ROWS:
            assert x["batches_per_s"] > 0 and x["bus_gbps"] is None, x
            continue
        assert x["gbps"] > 0 and x["bus_gbps"] > 0 and x["share_of_bus"] > 0, x
        assert x["round"] == 1 and x["threads"] >= 1, x
        assert "l3_mib" in x["host_cpu"], x
        assert 0 <= x["steal_share"] <= 1, x  # /proc/stat is there on Linux
        assert x["cpu_s_per_gb"] > 0, x
        # A Loader's rows count its slot claims; to_device's stager has none.
        loader_row = x["name"] != AB_ROWS[0]
        for key in ["own_slot_share", "slot_wait_share"]:
            assert (0 <= x[key] <= 1) if loader_row else x[key] is None, (key, x)
        per_batch = x["per_batch_us"]
        assert (per_batch["elapsed"] > 0) if loader_row else per_batch is None, x
    for name in AB_ROWS + AB_TOKEN_ROWS:
        assert name in stdout
    assert "stolen by the hypervisor" in stdout
    assert "CPU seconds a GB delivered" in stdout


def test_threads_sweep_runs_each_count(npy, tmp_path):
    out = tmp_path / "threads.json"
    args = ["--npy", str(npy), "--device", "cpu", "--small", "--threads", "1,2", "--out", str(out)]
    run("threads", *args, cwd=tmp_path)
    result = json.loads(out.read_text())
    assert result["default"]["threads"] >= 1
    paths = ["to_device", "Loader shuffle=none", "Loader shuffle=random"]
    assert sorted((x["path"], x["threads"]) for x in result["rows"]) == sorted(
        (p, n) for p in paths for n in [1, 2]
    )
    assert all(x["gbps"] > 0 and x["share_of_bus"] > 0 for x in result["rows"])
    assert all(x["cpu_s_per_gb"] > 0 and 0 <= x["steal_share"] <= 1 for x in result["rows"])


def test_pipeline_accounts_for_both_passes(npy, tmp_path):
    out = tmp_path / "pipeline.json"
    args = ["--npy", str(npy), "--device", "cpu", "--epochs", "1", "--out", str(out)]
    stdout = run("pipeline", *args, cwd=tmp_path)
    rows = json.loads(out.read_text())
    assert [x["shuffle"] for x in rows] == ["none", "random"]
    for x in rows:
        assert x["gbps"] > 0 and x["wall_gbps"] > 0 and x["threads"] >= 1, x
        assert 0 <= x["reading_share"] <= 1 and len(x["epochs"]) == 1, x
    assert "none: " in stdout and "random: " in stdout


def test_the_rows_check_catches_a_changed_byte(npy):
    ab = load_ab()
    data = np.load(npy, mmap_mode="r")
    loader = pinfeed.Loader(str(npy), 1000, shuffle="random", seed=1, **ab.loader_kwargs("cpu"))
    ab.drain(loader, ab.sums_check(data, "records"))
    changed = np.array(data)
    changed[4321, 1, 2, 3] ^= 1
    with pytest.raises(AssertionError, match="changed: the Loader delivered other bytes"):
        ab.drain(loader, ab.sums_check(changed, "changed"))


def test_in_turns_keeps_the_rows_of_the_runs_that_finished(tmp_path, capsys):
    ab = load_ab()
    ok = ("ok", ["-c", 'print("noise"); print(\'[{"row": 1}]\')'], None)
    failed = ("failed", ["-c", "import sys; sys.exit('worker broke')"], None)
    out = tmp_path / "rows.json"
    rows = ab.in_turns(2, [ok, failed], out)
    assert rows == [{"row": 1, "round": 1}, {"row": 1, "round": 2}]
    assert json.loads(out.read_text()) == rows
    printed = capsys.readouterr().out
    assert "round 1 failed: FAILED" in printed and "worker broke" in printed


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """`tokens.py text` at 2 MB of text in two files, on the host backend: (result, stdout)."""
    work = tmp_path_factory.mktemp("text")
    out = work / "text.json"
    args = ["--dir", str(work / "cache"), "--size-gb", "0.002", "--files", "2"]
    args += ["--device", "cpu", "--workers", "1", "--out", str(out)]
    done = script("tokens.py", "text", *args, cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def test_text_mode_runs_pinfeeds_rows_against_the_reference(text_run):
    result, stdout = text_run
    rows = {r["row"]: r for r in result["rows"]}
    assert list(rows) == ["pinfeed", "datasets map", "datasets streaming", "pre-tokenized"]
    # Sequential windows of 1024 tokens, each with the next token as its last target.
    windows = (result["corpus"]["reference_tokens"] - 1) // 1024
    for name in ["pinfeed", "pre-tokenized"]:
        r = rows[name]
        assert "error" not in r, r
        assert r["tokens"] == windows * 1024 and r["stopped"] is None, r
        assert r["checked_batches"][:2] == [0, 1], r
        assert r["tokens_per_s"] > 0 and r["cpu_s_per_mtok"] >= 0 and r["first_batch_s"] > 0, r
    # Tokenizing takes CPU time that /proc's clock ticks see; a pass of the .bin may not.
    assert rows["pinfeed"]["cpu_s_per_mtok"] > 0
    assert result["gpt"]["skipped"].startswith("needs a CUDA device"), result["gpt"]
    assert "target: pinfeed >= 3x datasets streaming" in stdout
    assert "target: GPT step within 1% of its bound: not measured" in stdout


def test_text_mode_runs_or_skips_the_datasets_rows(text_run):
    result, _ = text_run
    rows = {r["row"]: r for r in result["rows"]}
    hf = [rows["datasets map"], rows["datasets streaming"]]
    if importlib.util.find_spec("datasets") is None:
        for r in hf:
            assert r["skipped"].startswith("datasets does not import here"), r
        pytest.skip("`datasets` is not installed: its rows said they were skipped")
    for r in hf:
        assert "error" not in r and "skipped" not in r, r
        # run_clm's group_texts drops each map batch's remainder: fewer windows than pinfeed's.
        assert 0 < r["tokens"] <= rows["pinfeed"]["tokens"], r
        assert r["checked_batches"][:2] == [0, 1], r


def test_the_text_rows_check_catches_a_changed_token(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from lib import text_rows

    eos, t = 7, text_rows.T
    reference = np.random.default_rng(2).integers(8, 500, 3 * 12 * t + 1).astype(np.uint16)
    reference[::97] = eos
    k = 1  # the second batch: windows 12 .. 23
    w = np.stack([reference[v * t : v * t + t + 1] for v in range(12, 24)]).astype(np.int64)
    x, y = w[:, :-1], w[:, 1:]
    starts = np.zeros_like(x, dtype=bool)
    starts[:, 0] = True
    starts[:, 1:] = x[:, :-1] == eos
    first = np.maximum.accumulate(np.where(starts, np.arange(t), 0), axis=1)
    positions = np.arange(t) - first
    text_rows.check_by_position(reference, k, (x, y, None, positions, None), eos)
    text_rows.check_found(reference, k, w)
    changed = x.copy()
    changed[5, 300] += 1
    with pytest.raises(AssertionError, match="batch 1, window 17: not the reference's tokens"):
        text_rows.check_by_position(reference, k, (changed, y), eos)
    with pytest.raises(AssertionError, match="position ids do not restart at EOS"):
        text_rows.check_by_position(reference, k, (x, y, None, positions + 1, None), eos)
    w[-1, 9] += 1
    with pytest.raises(AssertionError, match="batch 1, window 11: not in the reference"):
        text_rows.check_found(reference, k, w)


def test_parquet_mode_checks_both_rows(tmp_path):
    out = tmp_path / "parquet.json"
    args = ["--dir", str(tmp_path / "cache"), "--size-gb", "0.004", "--columns", "8"]
    args += ["--batch", "1000", "--rounds", "1", "--passes", "1", "--device", "cpu"]
    stdout = run("parquet", *args, "--out", str(out), cwd=tmp_path)
    result = json.loads(out.read_text())
    assert result["rows"] == 4_000_000 // 32
    assert result["checked"] == {"parquet": [0, 1, 10, 100], "npy": [0, 1, 10, 100]}
    for kind in ["parquet", "npy"]:
        assert result["median"][kind]["gbps"] > 0, result
    assert "target: Parquet within 80% of .npy" in stdout


@pytest.mark.parametrize("workload", ["records.py", "tokens.py", "images.py", "peers.py"])
def test_a_workload_script_refuses_a_mode_it_has_not(workload, tmp_path):
    out = script(workload, "no-such-mode", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == "unknown mode 'no-such-mode'"
    assert "modes:" in out.stderr


def test_mixture_bench_times_every_row(tmp_path):
    """`bench/tokens.py mixture` on the host backend: one source, both mixture modes and, where
    they install, LitData's CombinedStreamingDataset and `datasets`' interleave; a peer that
    does not import is a row saying why, never a missing row."""
    out = tmp_path / "mixture.json"
    done = script(
        "tokens.py", "mixture", "--dir", str(tmp_path / "data"), "--size-gb", "0.004",
        "--shape", "4x64", "--device", "cpu", "--rounds", "1", "--steps", "20",
        "--peer-steps", "5", "--min-seconds", "0", "--warmup", "2", "--workers", "1",
        "--hf", "--litdata", "--out", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    best = json.loads(out.read_text())["best"]
    names = ["one source", "mixture exact", "mixture sampled", "hf interleave", "litdata combined"]
    assert list(best) == names
    for name in names[:3]:
        assert best[name]["steps"] >= 20 and best[name]["cpu_ms_per_step"] > 0, best[name]
    for name, module in [("hf interleave", "datasets"), ("litdata combined", "litdata")]:
        row = best[name]
        if importlib.util.find_spec(module) is None:
            assert module in row["skipped"], row
        else:
            assert row.get("steps", 0) >= 5, row
