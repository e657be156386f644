"""to_device's copy threads against CPU time: the seed tensor through a 64 MiB arena with T copy
threads, two interleaved rounds, beside torch's best per-row variant in the same process. A
probe, not part of the tables.

PYTHONPATH=SITE:bench python3 bench/probes/threads_probe.py [--threads 6,8,10,12,16] [--rounds 2]
"""

import argparse

import torch
from python_bench import upload_through
from torch_baselines import timed

import pinfeed

ap = argparse.ArgumentParser()
ap.add_argument("--threads", default="6,8,10,12,16", help="copy thread counts, comma-separated")
ap.add_argument("--rounds", type=int, default=2)
args = ap.parse_args()

a = torch.rand(1024, 655360)
n = a.numel() * 4


def rows():
    return [i.pin_memory().cuda(non_blocking=True) for i in a]


rows()
wall, torch_cpu = timed(rows)
print(
    f"torch rows: i.pin_memory().cuda(non_blocking=True): {n / wall / 1e9:6.2f} GB/s, {torch_cpu * 1e3:6.0f} ms CPU"
)
for round_ in range(args.rounds):
    for threads in [int(t) for t in args.threads.split(",")]:
        st = pinfeed._pinfeed.Stager("cuda", None, threads, "stage")
        upload_through(st, a)
        wall, cpu = timed(lambda: upload_through(st, a))
        print(
            f"round {round_} to_device, {threads:2d} copy threads: {n / wall / 1e9:6.2f} GB/s, {cpu * 1e3:6.0f} ms CPU ({cpu / torch_cpu:.2f}x torch)"
        )
        del st
