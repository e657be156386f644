"""Page faults in a host-backend pass: passes of a `pinfeed.Loader` over a 256 MiB host array
with `device="cpu"`, batches of 4 MiB, each pass a loader of its own (as every Python pass
is), with the process's minor page faults and GB/s for each. A batch whose memory the
allocator hands out afresh faults in each of its 1,024 pages when the host copy first writes
it, so faults a pass / 1,024 is about how many batches of the pass did not reuse memory.

    python3 bench/probes/host_pass_probe.py [--passes 5] [--out F]

A probe: prints a table, asserts nothing about speed (every pass's column sums are checked).
"""

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np

import pinfeed

RECORDS, RECORD = 65536, 1024  # 4 KiB float32 records: 256 MiB
BATCH = 1024  # 4 MiB


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    a = np.random.default_rng(0).integers(0, 1 << 20, size=(RECORDS, RECORD), dtype=np.int32)
    want = a.sum(axis=0, dtype=np.int64)
    loader = pinfeed.Loader(a, BATCH, device="cpu")
    rows = []
    for i in range(args.passes + 1):  # the first pass is untimed: it makes the pool
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        n, total = 0, np.zeros(RECORD, dtype=np.int64)
        for b in loader:
            n += b.nbytes
            total += np.asarray(b).sum(axis=0, dtype=np.int64)
        seconds = time.perf_counter() - start
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        assert np.array_equal(total, want), "the pass delivered other bytes"
        if i:
            rows.append(dict(gbps=n / seconds / 1e9, minor_faults=faults))
    print(f"{'pass':>4}{'GB/s':>8}{'minor faults':>14}{'batches faulted in':>20}")
    for i, r in enumerate(rows, 1):
        print(f"{i:>4}{r['gbps']:>8.2f}{r['minor_faults']:>14}{r['minor_faults'] / 1024:>20.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(passes=rows), indent=1))


if __name__ == "__main__":
    main()
