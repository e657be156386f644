"""How the pinned pool's footprint (slots x slot size) moves a `Loader`'s passes over the
page-cached 4 GiB `.npy`, in order and shuffled, each a share of torch's pinned `copy_` in the
same process.

The readers write slots while the copy engine reads them, both through the host's memory; the
smaller the set of slots in use, the more of it can stay in the last-level cache between the
two (the `Stager`'s arena is 64 MiB for that reason: docs/ARCHITECTURE.md). A loader's pool is
`2 x readers + 6` slots of a batch (or a piece) each: 30 slots of 2.95 MB, 88 MB, at 12
readers. The configurations shrink the count, the size or both:

    python3 bench/probes/footprint_probe.py [--npy /tmp/pinfeed-4g.npy] [--rounds 3]
        [--config LABEL=SPEC ...] [--out F] [--device cpu]

SPEC is `default`, or comma-separated `slots=+K` (the loader's readers + K slots, through
`pinned_budget`) and `piece=BYTES` (`piece_size`). Every configuration runs in a fresh process
(rounds in turns, each round in the reverse order of the last), checks what it delivered
against numpy's column sums, then times three passes of each order (the median). A probe:
prints a table, asserts nothing about speed. `--device cpu` runs it on the host backend, with
torch's host-to-host `copy_` as the reference, for the tests.
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ab import drain, in_turns, loader_kwargs, sums_check  # noqa: E402  (bench/ holds the shared helpers)
from rates import host_cpu  # noqa: E402

DEFAULT_CONFIGS = [
    "default=default",
    "slots r+4=slots=+4",
    "1 MiB pieces=piece=1048576",
    "1 MiB pieces, r+4=piece=1048576,slots=+4",
]


def parse_spec(spec):
    """`default` or `slots=+K,piece=BYTES` as (extra slots or None, piece size or None)."""
    extra, piece = None, None
    if spec == "default":
        return extra, piece
    for part in spec.split(","):
        key, _, value = part.partition("=")
        if key == "slots" and value[:1] == "+" and value[1:].isdigit():
            extra = int(value[1:])
        elif key == "piece" and value.isdigit():
            piece = int(value)
        else:
            raise SystemExit(f"unknown part {part!r} of {spec!r}: slots=+K or piece=BYTES")
    return extra, piece


def worker(npy, label, spec, device):
    import numpy as np
    from torch_baselines import bus_rate
    from torch_baselines import timed as best_of

    import pinfeed

    extra, piece = parse_spec(spec)
    data = np.load(npy, mmap_mode="r")
    check = sums_check(data, f"{label}: {npy}")
    bus = bus_rate(4 << 20, 256, device)

    rows = []
    machine_cpu = host_cpu()
    for shuffle in ["none", "random"]:
        kw = dict(shuffle=shuffle, seed=1, **loader_kwargs(device))
        if piece is not None:
            kw["piece_size"] = piece
        if extra is not None:
            # A loader of the same options tells the readers and the slot size; its pool is
            # kept for the next loader of the process.
            st = pinfeed.Loader(npy, 1024, **kw).stats()
            kw["pinned_budget"] = (st["threads"] + extra) * st["slot_bytes"]
        loader = pinfeed.Loader(npy, 1024, **kw)
        drain(loader, check)
        wall, cpu = best_of(lambda loader=loader: drain(loader))
        st = loader.stats()
        n, epoch = st["threads"], st["elapsed"]
        rows.append(
            {
                "config": label,
                "spec": spec,
                "shuffle": shuffle,
                "threads": n,
                "copy_gbps": st.get("copy_gbps"),
                "slots": st["slots"],
                "slot_bytes": st["slot_bytes"],
                "footprint_mib": st["slots"] * st["slot_bytes"] / 2**20,
                "gbps": data.nbytes / wall / 1e9,
                "cpu_s": cpu,
                "bus_gbps": bus,
                "share_of_bus": data.nbytes / wall / 1e9 / bus,
                "bottleneck": st.get("bottleneck"),
                "reader_gbps_while_reading": st["read_bytes"] / max(st["read_time"], 1e-9) / 1e9,
                "reading_share": st["read_time"] / (n * epoch),
                "wait_free_slot_share": st["wait_free_slot"] / (n * epoch),
                "own_slot_share": st["slot_claims_own"] / max(st["slot_claims"], 1),
                "host_cpu": machine_cpu,
            }
        )
        del loader
    print(json.dumps(rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npy", default="/tmp/pinfeed-4g.npy")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config", action="append", default=None, help="LABEL=SPEC (see above)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.npy, *args.worker, args.device)
    configs = [c.split("=", 1) for c in (args.config or DEFAULT_CONFIGS)]
    for _, spec in configs:
        parse_spec(spec)  # a bad one fails before anything runs
    runs = [
        (
            label,
            [__file__, "--npy", args.npy, "--device", args.device, "--worker", label, spec],
            dict(os.environ),
        )
        for label, spec in configs
    ]
    results = in_turns(args.rounds, runs, args.out)
    print(
        f"{'config':<26}{'readers':>8}{'slots':>6}{'MiB':>6}  {'in order, % of bus':<22}{'shuffled':<22}"
    )
    for label, _ in configs:
        cells = []
        for shuffle in ["none", "random"]:
            rs = [x for x in results if x["config"] == label and x["shuffle"] == shuffle]
            shares = sorted(100 * x["share_of_bus"] for x in rs)
            med = f" (**{shares[len(shares) // 2]:.0f}**)" if shares else ""
            cells.append("/".join(f"{100 * x['share_of_bus']:.0f}" for x in rs) + med)
        first = next((x for x in results if x["config"] == label), None)
        if first is None:
            continue
        print(
            f"{label:<26}{first['threads']:>8}{first['slots']:>6}{first['footprint_mib']:>6.0f}  "
            f"{cells[0]:<22}{cells[1]:<22}"
        )


if __name__ == "__main__":
    main()
