"""A three-source token mixture against the same bytes as one source (issue 49).

    python3 bench/tokens.py mixture [--size-gb 2] [--shape 12x1024] [--hf] [--litdata]
        [--model-steps 50] [--out results.json]

Writes one file of random uint16 tokens (`--size-gb`) and the same bytes cut into three
sources of 50%, 30% and 20%, then times random windows, steps per second and CPU per step,
for each of:

- `one source`: pinfeed.TokenLoader over the one file;
- `mixture exact`: pinfeed.TokenLoader({"a", "b", "c"}, weights=0.5/0.3/0.2) (every step holds
  each share);
- `mixture sampled`: the same with mode="sampled" (independent draws);
- with `--hf`, Hugging Face `datasets`' `interleave_datasets(probabilities=[0.5, 0.3, 0.2])` of
  three iterable datasets of random windows (numpy memmaps), through a torch DataLoader with
  `--workers` workers, batches moved to the device as nanoGPT's get_batch does. Skipped with
  the reason when `datasets` is not importable;
- with `--litdata`, LitData's `CombinedStreamingDataset(weights=(0.5, 0.3, 0.2))` of three
  `StreamingDataset(TokensLoader(block_size=T+1))` over the same tokens converted by its
  `optimize` (int32, as litgpt stores them), through its `StreamingDataLoader` with `--workers`
  workers and `pin_memory`, moved to the device. Skipped with the reason when `litdata` is not
  importable.

With `--model-steps N` (CUDA only), each pinfeed row and peer also feeds nanoGPT's GPT (the
peers harness's: 6 layers, 384 wide, bf16) for N steps, beside the same model fed one batch
already on the GPU (its bound): the issue's second target, a step within 1% of its bound.

CPU per step is this process's (time.process_time: every pinfeed thread) plus, for the
DataLoader's worker processes, theirs (/proc/PID/stat of each live child). Targets (issue 49):
the mixture within 5% of one source's steps/s. Runs on CUDA (`--device cuda`, the default where
torch sees a GPU) or on the host backend (`--device cpu`).
"""

import argparse
import json
import os
import time

import numpy as np

SHARES = {"a": 0.5, "b": 0.3, "c": 0.2}


def write_tokens(folder, size_bytes, vocab=50257):
    """`one.bin` of random uint16 tokens, and `a.bin`, `b.bin`, `c.bin` its bytes cut 50/30/20,
    written unless they have the size; each then read once (page cache)."""
    os.makedirs(folder, exist_ok=True)
    tokens = size_bytes // 2
    one = os.path.join(folder, "one.bin")
    if not (os.path.exists(one) and os.path.getsize(one) == 2 * tokens):
        rng = np.random.default_rng(0)
        with open(one, "wb") as f:
            left = tokens
            while left:
                n = min(1 << 26, left)
                rng.integers(0, vocab, n, dtype=np.uint16).tofile(f)
                left -= n
    data = np.memmap(one, dtype=np.uint16, mode="r")
    paths, start = {}, 0
    for k, (name, share) in enumerate(SHARES.items()):
        end = tokens if k == len(SHARES) - 1 else start + int(tokens * share)
        paths[name] = os.path.join(folder, f"{name}.bin")
        if not (os.path.exists(paths[name]) and os.path.getsize(paths[name]) == 2 * (end - start)):
            data[start:end].tofile(paths[name])
        start = end
    for path in [one, *paths.values()]:
        with open(path, "rb") as f:
            while f.read(1 << 26):
                pass
    return one, paths


def children_cpu():
    """CPU seconds of this process's live children (DataLoader workers), from /proc."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # ppid
            total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def sync(device):
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def timed(steps, device, warmup, n, min_seconds):
    """Steps per second and CPU ms per step of at least `n` steps and `min_seconds`, after
    `warmup` steps (a loader's read-ahead is a small part of what is timed)."""
    for _ in range(warmup):
        next(steps)
    sync(device)
    w0, p0, c0 = time.perf_counter(), time.process_time(), children_cpu()
    taken = 0
    while taken < n or time.perf_counter() - w0 < min_seconds:
        x, y = next(steps)
        taken += 1
    sync(device)
    seconds = time.perf_counter() - w0
    cpu = time.process_time() - p0 + children_cpu() - c0
    assert tuple(x.shape) == tuple(y.shape)
    return {"steps": taken, "steps_per_s": taken / seconds, "cpu_ms_per_step": 1000 * cpu / taken}


def pinfeed_steps(source, b, t, device, **mixture):
    import pinfeed

    loader = pinfeed.TokenLoader(
        source, t, b, token_dtype="uint16", sample="random", device=device, **mixture
    )
    yield from loader


def hf_steps(paths, b, t, device, workers):
    """interleave_datasets of three iterable datasets of random windows, by probabilities,
    through a torch DataLoader; batches moved to `device` as nanoGPT's get_batch does."""
    import datasets
    import torch

    def windows(path, seed):
        (path,), (seed,) = path, seed  # this shard's
        data = np.memmap(path, dtype=np.uint16, mode="r")
        rng = np.random.default_rng(seed)
        while True:
            i = int(rng.integers(0, len(data) - t - 1))
            yield {"tokens": data[i : i + t + 1].astype(np.int64)}

    # A shard a worker (gen_kwargs lists), so every DataLoader worker draws windows.
    shards = max(1, workers)
    sources = [
        datasets.IterableDataset.from_generator(
            windows,
            gen_kwargs={"path": [p] * shards, "seed": [k * shards + j for j in range(shards)]},
        )
        for k, p in enumerate(paths.values())
    ]
    mixed = datasets.interleave_datasets(
        sources, probabilities=list(SHARES.values()), seed=0, stopping_strategy="all_exhausted"
    ).with_format("torch")
    loader = torch.utils.data.DataLoader(
        mixed, batch_size=b, num_workers=workers, pin_memory=device.startswith("cuda")
    )
    for batch in loader:
        tok = batch["tokens"]
        if device.startswith("cuda"):
            tok = tok.to(device, non_blocking=True)
        yield tok[:, :-1], tok[:, 1:]


def litdata_steps(paths, b, t, device, workers, folder):
    """CombinedStreamingDataset of the three sources, each converted once by LitData's own
    `optimize` (TokensLoader, int32 tokens, as the peers harness converts) into
    `folder/litdata-NAME`."""
    import litdata
    from litdata import (
        CombinedStreamingDataset,
        StreamingDataLoader,
        StreamingDataset,
        TokensLoader,
    )

    from lib.peers_tokens import _litdata_piece

    parts = []
    for name, path in paths.items():
        out = os.path.join(folder, f"litdata-{name}")
        if not os.path.exists(os.path.join(out, ".done")):
            n = os.path.getsize(path) // 2
            litdata.optimize(
                fn=_litdata_piece,
                inputs=[(path, s, min(n, s + (1 << 22))) for s in range(0, n, 1 << 22)],
                output_dir=out,
                chunk_bytes="64MB",
                item_loader=TokensLoader(),
                num_workers=workers,
                verbose=False,
            )
            open(os.path.join(out, ".done"), "w").close()
        parts.append(
            StreamingDataset(out, item_loader=TokensLoader(block_size=t + 1), shuffle=True)
        )
    mixed = CombinedStreamingDataset(parts, weights=list(SHARES.values()), iterate_over_all=False)
    while True:
        loader = StreamingDataLoader(
            mixed, batch_size=b, num_workers=workers, pin_memory=True, drop_last=True
        )
        for tok in loader:
            if device.startswith("cuda"):
                tok = tok.to(device, non_blocking=True)
            tok = tok.long()
            yield tok[:, :-1], tok[:, 1:]


def gpt_steps(make, b, t, device, n):
    """ms a GPT step fed by `make()`'s steps, and fed its first step again and again."""
    if not device.startswith("cuda") or not n:
        return {}
    import types

    import torch

    from lib.peers_models import _steps, model_for

    torch.manual_seed(0)
    a = types.SimpleNamespace(workload="tokens", seq=t, batch=b, device=device)
    model, loss = model_for(a, torch)
    it = make()
    # int64 and contiguous, as nanoGPT's loss views the targets.
    fed = ((x.long().contiguous(), y.long().contiguous()) for x, y in it)
    ms = _steps(fed, model, loss, n, 5, torch)
    first = next(fed)
    bound = _steps(iter(lambda: first, None), model, loss, n, 5, torch)
    return {
        "model_ms_per_step": ms,
        "bound_ms_per_step": bound,
        "over_bound_pct": 100 * (ms / bound - 1),
    }


def rows_of(args, one, paths):
    b, t = (int(v) for v in args.shape.split("x"))
    cases = [
        ("one source", lambda: pinfeed_steps(one, b, t, args.device)),
        ("mixture exact", lambda: pinfeed_steps(paths, b, t, args.device, weights=SHARES)),
        (
            "mixture sampled",
            lambda: pinfeed_steps(paths, b, t, args.device, weights=SHARES, mode="sampled"),
        ),
    ]
    if args.hf:
        cases.append(("hf interleave", lambda: hf_steps(paths, b, t, args.device, args.workers)))
    if args.litdata:
        lit = lambda: litdata_steps(paths, b, t, args.device, args.workers, args.dir)  # noqa: E731
        cases.append(("litdata combined", lit))
    rows = []
    for _ in range(args.rounds):
        for name, make in cases:
            row = {"loader": name, "shape": [b, t]}
            if not available(name, row):
                rows.append(row)
                continue
            try:
                n = args.steps if name in PINFEED else args.peer_steps
                row.update(timed(make(), args.device, args.warmup, n, args.min_seconds))
                if _ == 0:  # the model's step, once a loader
                    row.update(gpt_steps(make, b, t, args.device, args.model_steps))
            except Exception as e:  # a failure is a row, not the end of the run
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            print(row, flush=True)
    return rows


PINFEED = ("one source", "mixture exact", "mixture sampled")
PEER_MODULES = {"hf interleave": "datasets", "litdata combined": "litdata"}


def available(name, row):
    """Whether the row's peer imports here; else the row says why."""
    if name not in PEER_MODULES:
        return True
    try:
        __import__(PEER_MODULES[name])
    except ImportError as e:
        row["skipped"] = f"`{PEER_MODULES[name]}` is not importable ({e})"
        return False
    return True


def table(rows):
    """Each loader's best round, beside one source's."""
    best = {}
    for r in rows:
        if "steps_per_s" in r:
            if r["loader"] not in best or r["steps_per_s"] > best[r["loader"]]["steps_per_s"]:
                best[r["loader"]] = r
        else:
            best.setdefault(r["loader"], r)
    # The model's step ran in the first round: its figures join the best round's row.
    for r in rows:
        if "over_bound_pct" in r and r["loader"] in best and "steps_per_s" in best[r["loader"]]:
            keys = ["model_ms_per_step", "bound_ms_per_step", "over_bound_pct"]
            best[r["loader"]] = {**best[r["loader"]], **{k: r[k] for k in keys}}
    base = best.get("one source", {}).get("steps_per_s")
    print(
        f"\n{'loader':<17} {'steps/s':>10} {'vs one source':>14} {'CPU ms/step':>12} {'GPT step':>10}"
    )
    for name, r in best.items():
        if "steps_per_s" not in r:
            print(f"{name:<17}  {r.get('error') or r.get('skipped')}")
            continue
        vs = f"{100 * (r['steps_per_s'] / base - 1):+.1f}%" if base else "-"
        gpt = f"{r['over_bound_pct']:+.2f}%" if "over_bound_pct" in r else "-"
        print(
            f"{name:<17} {r['steps_per_s']:>10.1f} {vs:>14} {r['cpu_ms_per_step']:>12.3f} {gpt:>10}"
        )
    return best


def default_device():
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp/pinfeed_mixture")
    p.add_argument("--size-gb", type=float, default=2.0, help="the tokens of all three sources")
    p.add_argument("--shape", default="12x1024", help="batch x seq_len")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda where present)")
    p.add_argument("--steps", type=int, default=2000, help="the least steps timed a row")
    p.add_argument("--min-seconds", type=float, default=3.0, help="the least time a row runs")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3, help="rounds of every loader, interleaved")
    p.add_argument("--hf", action="store_true", help="Hugging Face interleave_datasets too")
    p.add_argument("--litdata", action="store_true", help="LitData's CombinedStreamingDataset")
    p.add_argument("--workers", type=int, default=4, help="the peers' DataLoader workers")
    p.add_argument("--peer-steps", type=int, default=200, help="the least steps a peer's row")
    p.add_argument("--model-steps", type=int, default=0, help="GPT steps a row (CUDA only)")
    p.add_argument("--out", help="where to write the JSON results")
    args = p.parse_args()
    args.device = args.device or default_device()
    one, paths = write_tokens(args.dir, int(args.size_gb * 2**30) // 2 * 2)
    rows = rows_of(args, one, paths)
    best = table(rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "best": best}, f, indent=1)


if __name__ == "__main__":
    main()
