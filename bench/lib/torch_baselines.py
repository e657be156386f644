"""The torch baselines pinfeed is measured against, in the same run as pinfeed.

python3 bench/records.py torch --npy DATA.npy [--rows 1024 --cols 655360] --out results.json

Prints a table and writes JSON: the seed experiment's four per-row variants and a hand-written
torch ring, DataLoader variants over the .npy file as a memmap, and plain copy rates.
"""

import argparse
import json
import time

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler


def sync():
    """Waits for the GPU's work; nothing to wait for on a machine without one (a smoke run of
    a script on the host backend)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeat=3):
    """Median wall and CPU seconds of `fn` over `repeat` runs, the device synchronised."""
    runs = []
    for _ in range(repeat):
        sync()
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        sync()
        runs.append((time.perf_counter() - t0, time.process_time() - c0))
    runs.sort()
    return runs[len(runs) // 2]


def bus_rate(nbytes, reps, device="cuda"):
    """GB/s of torch's pinned `copy_` of `nbytes` to the GPU, `reps` copies a run: the bus that
    the other rows are a share of. With `device="cpu"` (the host backend), a `copy_` between two
    host tensors instead: a reference for a smoke run, not a bus."""
    pinned = device != "cpu"
    pin = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(pin, non_blocking=True)
    wall, _ = timed(lambda: [dst.copy_(pin, non_blocking=True) for _ in range(reps)])
    return nbytes * reps / wall / 1e9


def seed_experiment(rows, cols, repeat):
    a = torch.rand(rows, cols)
    total = a.numel() * 4
    variants = {
        "i.pin_memory().cuda(non_blocking=True)": lambda: [
            i.pin_memory().cuda(non_blocking=True) for i in a
        ],
        "i.pin_memory().cuda()": lambda: [i.pin_memory().cuda() for i in a],
        "i.cuda(non_blocking=True)": lambda: [i.cuda(non_blocking=True) for i in a],
        "i.cuda()": lambda: [i.cuda() for i in a],
        "a.cuda()": lambda: a.cuda(),
        "a.pin_memory().cuda()": lambda: a.pin_memory().cuda(),
    }

    def ring(slots=8):
        stream = torch.cuda.Stream()
        bufs = [torch.empty(cols, pin_memory=True) for _ in range(slots)]
        events = [None] * slots
        out = []
        for n, row in enumerate(a):
            k = n % slots
            if events[k] is not None:
                events[k].synchronize()
            bufs[k].copy_(row)
            with torch.cuda.stream(stream):
                out.append(bufs[k].cuda(non_blocking=True))
                events[k] = torch.cuda.Event()
                events[k].record(stream)
        stream.synchronize()

    variants["hand-written torch ring, 8 pinned slots"] = ring
    out = []
    for name, fn in variants.items():
        fn()  # warm-up: allocator caches, CUDA context
        wall, cpu = timed(fn, repeat)
        out.append({"name": name, "wall_s": wall, "cpu_s": cpu, "gbps": total / wall / 1e9})
    # Correctness of the baseline itself: the whole tensor survives a round trip.
    assert torch.equal(a.cuda().cpu(), a)
    return {"rows": rows, "cols": cols, "bytes": total, "variants": out}


class PerSample(Dataset):
    def __init__(self, mm):
        self.mm = mm

    def __len__(self):
        return len(self.mm)

    def __getitem__(self, i):
        return torch.from_numpy(np.array(self.mm[i]))


class WholeBatch(Dataset):
    """__getitem__ takes a list of indices (a BatchSampler) and reads them in one go."""

    def __init__(self, mm):
        self.mm = mm

    def __len__(self):
        return len(self.mm)

    def __getitem__(self, idx):
        idx = np.sort(np.asarray(idx))
        if idx[-1] - idx[0] + 1 == len(idx):
            return torch.from_numpy(np.array(self.mm[idx[0] : idx[-1] + 1]))
        return torch.from_numpy(self.mm[idx])


def run_loader(loader, max_batches):
    n = 0
    nbytes = 0
    torch.cuda.synchronize()
    c0, t0 = time.process_time(), time.perf_counter()
    for batch in loader:
        x = batch.cuda(non_blocking=True)
        nbytes += x.numel() * x.element_size()
        n += 1
        if n >= max_batches:
            break
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "cpu_s": time.process_time() - c0,
        "bytes": nbytes,
        "batches": n,
        "gbps": nbytes / wall / 1e9,
    }


def dataloaders(npy, batch_size):
    mm = np.load(npy, mmap_mode="r")
    n_batches = len(mm) // batch_size
    g = torch.Generator().manual_seed(0)
    configs = [
        (
            "per-sample dataset, shuffle, 0 workers, pin_memory=False",
            lambda: DataLoader(PerSample(mm), batch_size=batch_size, shuffle=True, generator=g),
            40,
        ),
        (
            "per-sample dataset, shuffle, 8 workers, pin_memory=True",
            lambda: DataLoader(
                PerSample(mm),
                batch_size=batch_size,
                shuffle=True,
                num_workers=8,
                pin_memory=True,
                generator=g,
            ),
            300,
        ),
        (
            "whole-batch reads, shuffle, 0 workers, pin_memory=True",
            lambda: DataLoader(
                WholeBatch(mm),
                sampler=BatchSampler(RandomSampler(mm, generator=g), batch_size, False),
                batch_size=None,
                pin_memory=True,
            ),
            600,
        ),
        (
            "whole-batch reads, sequential, 0 workers, pin_memory=True",
            lambda: DataLoader(
                WholeBatch(mm),
                sampler=BatchSampler(range(len(mm)), batch_size, False),
                batch_size=None,
                pin_memory=True,
            ),
            n_batches,
        ),
    ]
    out = []
    for name, make, limit in configs:
        r = run_loader(make(), min(limit, n_batches))
        r["name"] = name
        r["records_per_s"] = r["batches"] * batch_size / r["wall_s"]
        out.append(r)
    return out


def copy_rates(repeat):
    out = []
    for size in [1 << 20, 16 << 20, 256 << 20, 1 << 30]:
        pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        pageable = torch.empty(size, dtype=torch.uint8)
        pinned.fill_(1)
        pageable.fill_(1)
        dst = torch.empty(size, dtype=torch.uint8, device="cuda")
        n = max(1, (4 << 30) // size)
        for name, src in [("pinned", pinned), ("pageable", pageable)]:
            dst.copy_(src, non_blocking=True)
            wall, _ = timed(lambda: [dst.copy_(src, non_blocking=True) for _ in range(n)], repeat)
            out.append({"source": name, "bytes": size, "gbps": size * n / wall / 1e9})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--npy", required=True)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=655360)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.cuda.init()
    result = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "copy_rates": copy_rates(args.repeat),
        "seed": seed_experiment(args.rows, args.cols, args.repeat),
        "dataloader": dataloaders(args.npy, args.batch_size),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for v in result["seed"]["variants"]:
        print(
            f"seed  {v['name']:<45} {v['wall_s'] * 1e3:8.1f} ms {v['cpu_s'] * 1e3:8.1f} ms CPU {v['gbps']:6.2f} GB/s"
        )
    for v in result["dataloader"]:
        print(f"DL    {v['name']:<60} {v['gbps']:6.2f} GB/s ({v['batches']} batches)")
    for v in result["copy_rates"]:
        print(f"copy  {v['source']:<9} {v['bytes'] >> 20:6d} MiB {v['gbps']:6.2f} GB/s")


if __name__ == "__main__":
    main()
