"""Where the consumer's time goes in turning a 1 MiB batch into a torch tensor, step by step,
beside torch's own DLPack round trip of a tensor of the same size: whether pinfeed's export or
torch's import is the cost (docs/BENCHMARKS.md, "What limits each path").

PYTHONPATH=SITE python3 bench/records.py handover [--rounds 3]
"""

import argparse
import time

import numpy as np
import torch

import pinfeed
from pinfeed._arrays import torch_stream


def handover(loader, nbytes):
    """One pass of `loader` (`nbytes` in all) on torch's current stream, each batch's hand-over
    timed step by step: GB/s, microseconds a batch of each step, and the loader's explanation."""
    st = loader._start((0, 0, 0))
    steps = dict(next=0, stream=0, export=0, import_=0, release=0)
    k = 0
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    it = iter(st)
    while True:
        a = time.perf_counter_ns()
        buf = next(it, None)
        b = time.perf_counter_ns()
        if buf is None:
            break
        s = torch_stream(torch, torch.cuda.current_device())
        c = time.perf_counter_ns()
        capsule = buf.__dlpack__(stream=s)
        d = time.perf_counter_ns()
        x = torch.utils.dlpack.from_dlpack(capsule)
        e = time.perf_counter_ns()
        del x, capsule, buf
        f = time.perf_counter_ns()
        for name, dt in zip(steps, [b - a, c - b, d - c, e - d, f - e]):
            steps[name] += dt
        k += 1
    torch.cuda.synchronize()
    wall = (time.perf_counter_ns() - t0) / 1e9
    explanation = st.stats()["explanation"]
    st.close()
    return nbytes / wall / 1e9, {n.rstrip("_"): v / k / 1e3 for n, v in steps.items()}, explanation


def torch_round_trip(n=1024):
    """torch's own export and import of a 1 MiB CUDA tensor, a step at a time (µs)."""
    ts = [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(n)]
    exp = imp = rel = 0
    for t in ts:
        a = time.perf_counter_ns()
        capsule = torch.utils.dlpack.to_dlpack(t)
        b = time.perf_counter_ns()
        x = torch.utils.dlpack.from_dlpack(capsule)
        c = time.perf_counter_ns()
        del x, capsule
        d = time.perf_counter_ns()
        exp, imp, rel = exp + b - a, imp + c - b, rel + d - c
    return exp / n / 1e3, imp / n / 1e3, rel / n / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    total = 1 << 30
    rng = np.random.default_rng(0)
    src = rng.integers(0, 255, size=total, dtype=np.uint8).reshape(-1, 1024)
    loader = pinfeed.Loader(src, 1024, device="cuda")
    for _x in loader:
        pass
    for r in range(args.rounds):
        gbps, steps, explanation = handover(loader, total)
        exp, imp, rel = torch_round_trip()
        print(
            f"round {r + 1}: {gbps:6.2f} GB/s; a batch (us): "
            + ", ".join(f"{n} {v:5.1f}" for n, v in steps.items())
            + f"; torch's own to_dlpack {exp:4.1f}, from_dlpack {imp:4.1f}, release {rel:4.1f}"
            + f"; {explanation}",
            flush=True,
        )


if __name__ == "__main__":
    main()
