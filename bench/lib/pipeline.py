"""Where a `Loader`'s readers spend an epoch of the page-cached 4 GiB `.npy`, in order and
shuffled: the share of the epoch each reader was reading, each reader's rate while reading,
and the time it waited for a free slot, beside the loader's delivered rate. Compared with
`copy_rates --gather` at the same thread count (the readers' gathers alone), it says whether
a shuffled loader below the bus is held by the gathers themselves (readers reading all the
time, each as fast as alone) or by the pipeline around them.

    python3 bench/records.py pipeline [--npy /tmp/pinfeed-4g.npy] [--threads N] [--out F]

A probe: prints a table, asserts nothing about speed. Each row is the median of `--epochs`
epochs (by GB/s) after one untimed epoch, from the loader's own account of that epoch.
"""

import argparse
import json
import time
from pathlib import Path

import pinfeed  # noqa: E402
from lib.ab import drain
from lib.rates import machine_rates


def shares(st):
    """One epoch's account from its stats (the loader's counters cover its last epoch)."""
    n, wall = st["threads"], st["elapsed"]
    per_reader = st["read_bytes"] / max(st["read_time"], 1e-9) / 1e9
    return dict(
        machine_rates(st),
        slots=st["slots"],
        slots_peak=st["slots_peak_in_use"],
        gbps=st["bytes"] / wall / 1e9,
        startup_s=st.get("startup"),
        reading_share=st["read_time"] / (n * wall),
        reader_gbps_while_reading=per_reader,
        readers_gbps_if_always_reading=per_reader * n,
        wait_free_slot_share=st["wait_free_slot"] / (n * wall),
        copy_waiting_filled_share=st["wait_filled"] / wall,
        copy_waiting_consumer_share=st["wait_consumer"] / wall,
        consumer_waiting_share=st["consumer_wait"] / wall,
        slot_waits=st["slot_waits"],
        # Claims in which a reader got back a slot it filled itself (absent in older builds).
        own_slot_share=st["slot_claims_own"] / max(st["slot_claims"], 1)
        if "slot_claims_own" in st
        else None,
        # Readers waiting for a slot with no copy in flight (slots held behind a batch still
        # being read, or a consumer that was behind), and the copy thread waiting for a batch
        # while later ones were filled (absent in older builds).
        wait_free_slot_no_copy_share=st["wait_free_slot_no_copy"] / (n * wall)
        if "wait_free_slot_no_copy" in st
        else None,
        copy_waiting_filled_behind_share=st["wait_filled_behind"] / wall
        if "wait_filled_behind" in st
        else None,
        explanation=st["explanation"],
    )


def anon_huge_mib():
    """The process's anonymous memory in transparent huge pages, MiB (the pool asks for them)."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) / 1024
    return None


def probe(npy, shuffle, threads, epochs, device):
    """The median epoch (by GB/s) of ``epochs`` after one untimed epoch, with every epoch's."""
    kw = dict(device=device, shuffle=shuffle, seed=1)
    if threads:
        kw["num_threads"] = threads
    loader = pinfeed.Loader(npy, 1024, **kw)
    drain(loader)
    runs = []
    for _ in range(epochs):
        start = time.perf_counter()
        drain(loader)
        wall = time.perf_counter() - start
        st = loader.stats()
        runs.append(dict(shares(st), wall_gbps=st["bytes"] / wall / 1e9, wall_s=wall))
    runs.sort(key=lambda r: r["gbps"])
    return dict(runs[len(runs) // 2], shuffle=shuffle, epochs=runs, anon_huge_mib=anon_huge_mib())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npy", default="/tmp/pinfeed-4g.npy")
    ap.add_argument("--threads", type=int, default=None, help="readers (default: the loader's)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--after-to-device",
        action="store_true",
        help="first upload the seed tensor with to_device three times, as bench/records.py ab does",
    )
    args = ap.parse_args()
    if args.after_to_device:
        import torch

        a = torch.rand(1024, 655360)
        for _ in range(3):
            pinfeed.to_device(a, device=args.device)
        torch.cuda.synchronize()
        del a
    rows = [probe(args.npy, s, args.threads, args.epochs, args.device) for s in ("none", "random")]
    print(
        f"{'shuffle':<8}{'threads':>8}{'GB/s':>8}{'reading':>9}{'GB/s/reader':>13}"
        f"{'all readers':>13}{'slot wait':>11}{'copy idle':>11}{'wall GB/s':>11}{'start ms':>10}{'huge MiB':>9}{'slots used':>12}"
        f"{'own slot':>10}{'no copy':>9}{'behind':>8}"
    )

    def share(x, width):
        return f"{x:>{width}.0%}" if x is not None else " " * width

    for r in rows:
        print(
            f"{r['shuffle']:<8}{r['threads']:>8}{r['gbps']:>8.1f}{r['reading_share']:>9.0%}"
            f"{r['reader_gbps_while_reading']:>13.2f}{r['readers_gbps_if_always_reading']:>13.1f}"
            f"{r['wait_free_slot_share']:>11.0%}{r['copy_waiting_filled_share']:>11.0%}"
            f"{r['wall_gbps']:>11.1f}"
            f"{(r['startup_s'] or float('nan')) * 1e3:>10.1f}{r['anon_huge_mib'] or 0:>9.0f}"
            f"{r['slots_peak']:>7} of {r['slots']:<3}"
            + share(r["own_slot_share"], 10)
            + share(r["wait_free_slot_no_copy_share"], 9)
            + share(r["copy_waiting_filled_behind_share"], 8)
        )
    for r in rows:
        print(f"{r['shuffle']}: {r['explanation']}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
