"""Where prefetch(DataLoader) loses time against the DataLoader alone, and what 1 MiB batches
spend per batch: a probe, not part of the tables.

PYTHONPATH=SITE:bench python3 bench/probes/prefetch_probe.py DATA.npy PINFEED_BIN
"""

import json
import subprocess
import sys
import time

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader
from torch_baselines import WholeBatch, timed

import pinfeed

npy, pinfeed_bin = sys.argv[1], sys.argv[2]
mm = np.load(npy, mmap_mode="r")
n = mm.size


def seq():
    return DataLoader(
        WholeBatch(mm), sampler=BatchSampler(range(len(mm)), 1024, False), batch_size=None
    )


def consume(it):
    for _x in it:
        pass
    torch.cuda.synchronize()


def report(name, wall, p=None):
    extra = f"  [{p.stats()['bottleneck']}]" if p is not None else ""
    print(f"{name:<60} {n / wall / 1e9:6.2f} GB/s{extra}")


wall, _ = timed(lambda: consume(seq()), repeat=1)
report("DataLoader alone, no copy", wall)
items = list(seq())[:400]
nb = sum(x.numel() for x in items)
t0 = time.perf_counter()
consume(pinfeed.prefetch(items, device="cuda"))
print(
    f"{'prefetch(list of 400 ready tensors): upload ceiling':<60} {nb / (time.perf_counter() - t0) / 1e9:6.2f} GB/s"
)
for interval in [None, 0.0005]:
    if interval:
        sys.setswitchinterval(interval)
    p = pinfeed.prefetch(seq(), device="cuda")
    t0 = time.perf_counter()
    consume(p)
    report(
        f"prefetch(DataLoader), switch interval {sys.getswitchinterval()}",
        time.perf_counter() - t0,
        p,
    )
sys.setswitchinterval(0.005)
src = np.random.default_rng(0).integers(0, 255, size=1 << 30, dtype=np.uint8).reshape(-1, 4096)
loader = pinfeed.Loader(src, 256, device="cuda")
consume(loader)
t0 = time.perf_counter()
k = 0
for _x in loader:
    k += 1
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(
    f"Loader 1 MiB: {src.nbytes / dt / 1e9:.2f} GB/s, {dt / k * 1e6:.1f} us a batch; {loader.stats()['explanation']}"
)


def per_batch(name, take):
    """One pass of the loader's own stream, each batch handed to `take`."""
    st = loader._start((0, 0, 0))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    k = 0
    for buf in st:
        take(buf)
        k += 1
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(
        f"  1 MiB, {name:<52} {src.nbytes / dt / 1e9:6.2f} GB/s {dt / k * 1e6:6.1f} us a batch; {st.stats()['explanation']}"
    )
    st.close()


def legacy():
    return torch.cuda.current_stream().cuda_stream or 1


per_batch("stream only (buffers dropped unexported)", lambda b: None)
per_batch("torch.from_dlpack(buf)", lambda b: torch.from_dlpack(b))
per_batch(
    "torch._C._from_dlpack(buf.__dlpack__(stream))",
    lambda b: torch._C._from_dlpack(b.__dlpack__(stream=legacy())),
)
per_batch(
    "buf.__dlpack__(stream=-1) (no stream wait)",
    lambda b: torch._C._from_dlpack(b.__dlpack__(stream=-1)),
)
held = []
per_batch("torch.from_dlpack(buf), tensors kept", lambda b: held.append(torch.from_dlpack(b)))
del held
torch.cuda.synchronize()
t0 = time.perf_counter()
dst = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
pin = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
for _ in range(1024):
    dst.copy_(pin, non_blocking=True)
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(
    f"  1 MiB pinned copy_ into one buffer: {(1 << 30) / dt / 1e9:.2f} GB/s, {dt / 1024 * 1e6:.1f} us a copy"
)
path = "/tmp/probe-1g.npy"
np.save(path, src)
for bs in [256, 1024]:
    r = json.loads(
        subprocess.check_output(
            [pinfeed_bin, "stream", path, "--batch-size", str(bs), "--json", "--epochs", "3"]
        )
    )
    print(
        f"stream {bs // 256} MiB x3 epochs: {r['streaming_gbps']:.2f} GB/s after start-up, setup {r['setup_s'] * 1e3:.0f} ms; {r['explanation']}; stages {json.dumps({k: round(v, 3) for k, v in r['stages'].items()})}"
    )
