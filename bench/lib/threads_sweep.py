"""How the CPU-copy paths scale with threads on this machine: `to_device` of the seed tensor
through an arena with N copy threads, and a `Loader` pass over the page-cached 4 GiB `.npy` in
order and shuffled with N reader threads, beside torch's pinned `copy_` of the same sizes (the
bus) in the same process. What the adaptive defaults are chosen against.

    python3 bench/records.py threads [--npy /tmp/pinfeed-4g.npy] [--out sweep.json]
        [--device cpu --small]

Each row's bytes are checked once (column sums against numpy's or torch's) before it is timed;
each figure is the median of three runs. Each row records the process's CPU seconds a GB
delivered and the share of the machine's CPU time the hypervisor stole meanwhile, as
bench/records.py ab's do. `--device cpu --small` as in bench/records.py ab: the host
backend at small sizes, for the tests.
"""

import argparse
import json

import numpy as np
import torch

import pinfeed
from lib.ab import drain, loader_kwargs, measure, sizes, sums_check
from lib.python_bench import upload_through
from lib.torch_baselines import bus_rate


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npy", default="/tmp/pinfeed-4g.npy")
    ap.add_argument("--threads", default="4,8,12,16")
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--small", action="store_true", help="small sizes (bench/records.py ab)")
    args = ap.parse_args()
    device, size = args.device, sizes(args.small)
    counts = [int(t) for t in args.threads.split(",")]
    rows = []

    def row(path, threads, nbytes, timing, bus, extra=None):
        wall, cpu, steal = timing
        r = {"path": path, "threads": threads, "gbps": nbytes / wall / 1e9, "cpu_s": cpu}
        r["cpu_s_per_gb"], r["steal_share"] = cpu / (nbytes / 1e9), steal
        r["bus_gbps"], r["share_of_bus"] = bus, r["gbps"] / bus
        r.update(extra or {})
        rows.append(r)
        print(
            f"{path:<24} threads {threads:2d} {r['gbps']:6.1f} GB/s ({100 * r['share_of_bus']:3.0f}% of "
            f"{bus:.1f}) cpu {cpu:.2f}s stolen {steal:.1%} {r.get('bottleneck') or ''}",
            flush=True,
        )

    default = pinfeed.staging._shared_stager(device, None).counters()
    print(f"default copy threads here: {default.get('threads_reason')}", flush=True)
    a = torch.rand(*size["seed"])
    want = a.sum(dim=0, dtype=torch.float64)
    bus = bus_rate(*size["bus_seed"], device)
    for n in counts:
        st = pinfeed._pinfeed.Stager(device, None, n, "stage")
        got = torch.as_tensor(upload_through(st, a))  # numpy on the host backend
        assert torch.equal(got.sum(dim=0, dtype=torch.float64).cpu(), want), "to_device differs"
        del got
        timing = measure(lambda st=st: upload_through(st, a))
        row("to_device", n, a.numel() * 4, timing, bus)
        del st
    del a

    data = np.load(args.npy, mmap_mode="r")
    check = sums_check(data, args.npy)
    bus = bus_rate(*size["bus_file"], device)

    for shuffle in ["none", "random"]:
        for n in counts:
            kw = loader_kwargs(device)
            loader = pinfeed.Loader(args.npy, 1024, shuffle=shuffle, seed=1, num_threads=n, **kw)
            drain(loader, check)
            timing = measure(lambda loader=loader: drain(loader))
            st = loader.stats()
            extra = {"slots": st.get("slots"), "bottleneck": st.get("bottleneck")}
            row(f"Loader shuffle={shuffle}", n, data.nbytes, timing, bus, extra)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"default": default, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
