"""Token batches for language-model training: pinfeed's TokenLoader against nanoGPT's get_batch.

    python3 bench/tokens.py nanogpt [--size-gb 2] [--train-steps 300] [--out results.json]

Runs on a CUDA machine with torch and the pinfeed wheel. Two measurements:

(a) the data path alone: batches per second and CPU time (time.process_time, and
    resource.getrusage user + system) of nanoGPT's get_batch and of
    pinfeed.TokenLoader(..., device="cuda"), both yielding (x, y) int64 CUDA tensors, at
    nanoGPT's default shape 12 x 1024 and a large one, 64 x 4096, over a synthetic train.bin of
    random uint16 tokens (read once first, so both read from the page cache);
(b) a training loop of nanoGPT's GPT (bench/lib/nanogpt_model.py, a small configuration, bf16
    autocast) three ways: get_batch, pinfeed, and one batch already on the GPU (the bound).

It prints a short table and writes everything as JSON to --out.
"""

import argparse
import json
import os
import resource
import time

import numpy as np
import torch

from lib.nanogpt_model import GPT, GPTConfig  # noqa: E402
from lib.rates import machine_rates  # noqa: E402

# Globals that nanoGPT's get_batch reads, as train.py defines them; set per run below.
data_dir = ""
block_size = 1024
batch_size = 12
device = "cuda"
device_type = "cuda"


# fmt: off
# get_batch, copied verbatim from karpathy/nanoGPT train.py (commit
# 3adf61e154c3fe3fca428ad6bc3818b27a3b8291). MIT License, Copyright (c) 2022 Andrej Karpathy.
def get_batch(split):
    # We recreate np.memmap every batch to avoid a memory leak, as per
    # https://stackoverflow.com/questions/45132940/numpy-memmap-memory-usage-want-to-iterate-once/61472122#61472122
    if split == 'train':
        data = np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')
    else:
        data = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i+block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i+1:i+1+block_size]).astype(np.int64)) for i in ix])
    if device_type == 'cuda':
        # pin arrays x,y, which allows us to move them to GPU asynchronously (non_blocking=True)
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y
# fmt: on


def make_train_bin(path, size_bytes, vocab=50257):
    """Writes random uint16 tokens below `vocab` unless the file already has the size; then
    reads it once so that every run reads it from the page cache."""
    if not (os.path.exists(path) and os.path.getsize(path) == size_bytes):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        rng = np.random.default_rng(0)
        chunk = 1 << 26  # tokens
        with open(path, "wb") as f:
            left = size_bytes // 2
            while left:
                n = min(chunk, left)
                rng.integers(0, vocab, n, dtype=np.uint16).tofile(f)
                left -= n
    with open(path, "rb") as f:
        while f.read(1 << 26):
            pass


def cpu_seconds():
    """(process_time, getrusage user + system) of this process, every thread included."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.process_time(), r.ru_utime + r.ru_stime


def timed(batches, n_warm, n, min_seconds):
    """Takes n_warm batches, then times at least n and for at least min_seconds, so that a
    loader's prefetched batches are a small part of what is timed: wall seconds, CPU seconds
    (two ways) and the batches taken."""
    for _ in range(n_warm):
        x, y = next(batches)
    torch.cuda.synchronize()
    w0, (p0, r0) = time.perf_counter(), cpu_seconds()
    taken = 0
    while taken < n or time.perf_counter() - w0 < min_seconds:
        x, y = next(batches)
        taken += 1
    torch.cuda.synchronize()
    w1, (p1, r1) = time.perf_counter(), cpu_seconds()
    assert x.dtype == torch.int64 and x.is_cuda and x.shape == y.shape
    return {"seconds": w1 - w0, "process_time": p1 - p0, "rusage_cpu": r1 - r0, "batches": taken}


def get_batch_stream(path, b, t):
    global data_dir, block_size, batch_size
    data_dir, block_size, batch_size = os.path.dirname(path), t, b
    while True:
        yield get_batch("train")


# The last TokenLoader made, whose stats() give the machine's rates for the report.
LAST = {}


def pinfeed_stream(path, b, t, steps=None):
    import pinfeed

    loader = LAST["loader"] = pinfeed.TokenLoader(
        path,
        seq_len=t,
        batch_size=b,
        dtype="uint16",
        sample="random",
        seed=0,
        steps=steps,
        device="cuda",
    )
    yield from loader


def data_path(args):
    rows = []
    for shape in args.shapes.split(","):
        b, t = (int(v) for v in shape.split("x"))
        n = max(10, args.data_batches * 12 * 1024 // (b * t))
        for name, make in [("get_batch", get_batch_stream), ("pinfeed", pinfeed_stream)]:
            row = {"shape": [b, t], "loader": name}
            try:
                row.update(timed(make(args.path, b, t), args.warmup, n, args.min_seconds))
                row["batches_per_s"] = row["batches"] / row["seconds"]
                row["cpu_ms_per_batch"] = 1000 * row["process_time"] / row["batches"]
            except Exception as e:  # a missing API or a failure is a row, not the end
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            print(row, flush=True)
    return rows


def train(args, name):
    torch.manual_seed(0)
    b, t = args.train_batch, args.train_block
    config = GPTConfig(
        block_size=t,
        vocab_size=50304,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        dropout=0.0,
        bias=False,
    )
    model = GPT(config).to("cuda")
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda")
    if args.compile:
        model = torch.compile(model)
    if name == "get_batch":
        batches = get_batch_stream(args.path, b, t)
    elif name == "pinfeed":
        batches = pinfeed_stream(args.path, b, t, steps=args.train_steps + args.warmup + 1)
    else:
        one = next(get_batch_stream(args.path, b, t))
        batches = iter(lambda: one, None)
    ctx = torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    X, Y = next(batches)

    def step():
        nonlocal X, Y
        with ctx:
            logits, loss = model(X, Y)
        # As nanoGPT's train.py: fetch the next batch while the GPU runs the forward pass.
        X, Y = next(batches)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    w0, (p0, _) = time.perf_counter(), cpu_seconds()
    for _ in range(args.train_steps):
        loss = step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - w0
    return {
        "loader": name,
        "steps": args.train_steps,
        "seconds": seconds,
        "ms_per_step": 1000 * seconds / args.train_steps,
        "cpu_ms_per_step": 1000 * (cpu_seconds()[0] - p0) / args.train_steps,
        "final_loss": float(loss.item()),
    }


def training(args):
    """Each loader `--rounds` times, interleaved (bound, get_batch, pinfeed, bound, ...), so that
    clocks warming up or drifting fall on every loader alike; the median of each is reported."""
    runs = {name: [] for name in ["bound", "get_batch", "pinfeed"]}
    errors = {}
    for _ in range(args.rounds):
        for name in runs:
            try:
                row = train(args, name)
            except Exception as e:
                errors[name] = f"{type(e).__name__}: {e}"
                continue
            runs[name].append(row)
            print(row, flush=True)
    rows = []
    for name, done in runs.items():
        if not done:
            rows.append({"loader": name, "error": errors.get(name, "no run")})
            continue
        done.sort(key=lambda r: r["ms_per_step"])
        row = dict(done[len(done) // 2])
        row["ms_per_step_runs"] = [r["ms_per_step"] for r in done]
        rows.append(row)
    bound = rows[0].get("ms_per_step")
    for row in rows:
        if bound and "ms_per_step" in row:
            row["overhead_vs_bound_pct"] = 100 * (row["ms_per_step"] / bound - 1)
    return rows


def table(data_rows, train_rows):
    print("\n(a) data path alone")
    print(f"{'shape':>10} {'loader':>10} {'batches/s':>10} {'CPU ms/batch':>13}")
    for r in data_rows:
        shape = "x".join(map(str, r["shape"]))
        if "error" in r:
            print(f"{shape:>10} {r['loader']:>10}  {r['error']}")
        else:
            print(
                f"{shape:>10} {r['loader']:>10} {r['batches_per_s']:>10.1f} "
                f"{r['cpu_ms_per_batch']:>13.2f}"
            )
    print("\n(b) training loop")
    print(f"{'loader':>10} {'ms/step':>8} {'vs bound':>9} {'CPU ms/step':>12}")
    for r in train_rows:
        if "error" in r:
            print(f"{r['loader']:>10}  {r['error']}")
        else:
            print(
                f"{r['loader']:>10} {r['ms_per_step']:>8.2f} "
                f"{r.get('overhead_vs_bound_pct', 0):>8.2f}% {r['cpu_ms_per_step']:>12.2f}"
            )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--path", default="/tmp/pinfeed_tokens/train.bin")
    p.add_argument("--size-gb", type=float, default=2.0)
    p.add_argument("--shapes", default="12x1024,64x4096")
    p.add_argument(
        "--data-batches",
        type=int,
        default=500,
        help="batches timed at 12 x 1024; other shapes take as many tokens",
    )
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument(
        "--min-seconds", type=float, default=2.0, help="the least time each data-path row runs"
    )
    p.add_argument("--train-steps", type=int, default=300)
    p.add_argument(
        "--rounds", type=int, default=3, help="training runs of each loader, interleaved"
    )
    p.add_argument("--train-batch", type=int, default=12)
    p.add_argument("--train-block", type=int, default=1024)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--out", help="where to write the JSON results")
    args = p.parse_args()

    make_train_bin(args.path, int(args.size_gb * 2**30) // 2 * 2)
    data_rows = data_path(args)
    train_rows = [] if args.skip_train else training(args)
    table(data_rows, train_rows)
    if args.out:
        result = {
            "args": vars(args),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(),
            "cpus": os.cpu_count(),
            "machine": machine_rates(LAST["loader"].stats()) if "loader" in LAST else None,
            "data_path": data_rows,
            "training": train_rows,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
