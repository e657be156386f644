"""Batch sizes and the per-batch cost of 1 MiB batches, with whichever pinfeed is importable: run
it once per build (interleaved) to compare two builds on one machine. A probe, not part of the
tables.

PYTHONPATH=SITE python3 bench/probes/batch_probe.py LABEL [--threads 8,12,16] [--sizes 1,4,16,64,256]
    [--prefetch 4,16,64] [--rounds 3]
"""

import argparse
import time

import numpy as np
import torch
from handover_probe import handover  # bench/probes/ is the script's folder, on sys.path

import pinfeed

ap = argparse.ArgumentParser()
ap.add_argument("label", nargs="?", default="pinfeed")
ap.add_argument(
    "--threads", default="", help="reader threads to try, comma-separated (default: the Loader's)"
)
ap.add_argument("--sizes", default="1,4,16,64,256", help="batch sizes in MiB")
ap.add_argument(
    "--prefetch",
    default="",
    help="Loader prefetch depths to try, comma-separated (default: the Loader's)",
)
ap.add_argument("--rounds", type=int, default=1, help="rounds of every combination, interleaved")
args = ap.parse_args()
label = args.label
thread_counts = [int(t) for t in args.threads.split(",") if t] or [None]
sizes = [int(m) for m in args.sizes.split(",")]
depths = [int(d) for d in args.prefetch.split(",") if d] or [None]
total = 1 << 30
src = np.random.default_rng(0).integers(0, 255, size=total, dtype=np.uint8).reshape(-1, 4096)


def best(fn, repeat=3):
    runs = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
    return min(runs)


def drain(loader):
    for _x in loader:
        pass


def options(threads, depth):
    opts = {} if threads is None else {"num_threads": threads}
    if depth is not None:
        opts["prefetch"] = depth
    return opts


for round_ in range(args.rounds):
    for mib in sizes:
        n = mib << 20
        pin = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(n, dtype=torch.uint8, device="cuda")

        def copies():
            for _ in range(total // n):
                dst.copy_(pin, non_blocking=True)

        copies()
        copy = total / best(copies) / 1e9
        for threads, depth in [(t, d) for t in thread_counts for d in depths]:
            loader = pinfeed.Loader(src, mib * 256, device="cuda", **options(threads, depth))
            drain(loader)
            got = total / best(lambda: drain(loader)) / 1e9
            st = loader.stats()
            print(
                f"{label} round {round_ + 1}: {mib:3d} MiB, {st['threads']} readers, {st['slots']} slots, "
                f"prefetch {depth or 'default'}: pinned copy_ {copy:6.2f} GB/s, "
                f"Loader {got:6.2f} GB/s ({got / copy:.0%}); {st['explanation']}",
                flush=True,
            )
            del loader
        del pin, dst

# Where a 1 MiB batch's time goes on the consumer's thread, on torch's current stream and on a
# side stream.
for depth in dict.fromkeys([depths[0], depths[-1]]):
    loader = pinfeed.Loader(src, 256, device="cuda", **options(None, depth))
    drain(loader)
    for where, stream in [
        ("the current stream", torch.cuda.current_stream()),
        ("a side stream", torch.cuda.Stream()),
    ]:
        with torch.cuda.stream(stream):
            gbps, steps, explanation = handover(loader, total)
        print(
            f"{label}: prefetch {depth or 'default'}, 1 MiB on {where}: {gbps:6.2f} GB/s, "
            + ", ".join(f"{n} {v:5.1f} us" for n, v in steps.items())
            + f"; {explanation}"
        )
