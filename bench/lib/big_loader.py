"""The 40 GB page-cached file through the Python `pinfeed.Loader`, as a training loop sees it:
passes over the file with one Loader (the first pass makes the pinned ring and the device
memory; later passes reuse them), each timed, beside the Loader's own account. Checks sampled
batches against the file.

PYTHONPATH=SITE python3 bench/records.py big BIG.npy OUT.json
"""

import json
import sys
import time

import numpy as np
import torch

import pinfeed
from lib.rates import machine_rates

path, out = sys.argv[1], sys.argv[2]
mm = np.load(path, mmap_mode="r")
n = mm.nbytes
batch = 1024
rows = []
for reader in ["pread", "auto"]:
    loader = pinfeed.Loader(path, batch, device="cuda", reader=reader)
    for p in range(3):
        torch.cuda.synchronize()
        c0, t0 = time.process_time(), time.perf_counter()
        at = 0
        for x in loader:
            k = x.shape[0]
            if p == 0 and (at % (4000 * batch) == 0 or at + k == len(mm)):
                want = torch.from_numpy(np.array(mm[at : at + k]))
                assert torch.equal(x.cpu(), want), f"{reader}: batch at record {at} differs"
            at += k
        torch.cuda.synchronize()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert at == len(mm), f"{reader}: {at} records of {len(mm)}"
        st = loader.stats()
        r = {
            **machine_rates(st),
            "reader": reader,
            "pass": p,
            "gbps": n / wall / 1e9,
            "wall_s": wall,
            "cpu_s": cpu,
            "described": st.get("reader"),
            "explanation": st["explanation"],
        }
        rows.append(r)
        print(
            f"Loader(40 GB, {batch}) reader={reader} [{r['described']}, {r['threads']} threads] pass {p}"
            f"{' (checked)' if p == 0 else ''}: {r['gbps']:6.2f} GB/s, {cpu:5.1f} s CPU; {r['explanation']}"
        )
    del loader
json.dump(rows, open(out, "w"), indent=1)
