"""Whether memory is slow the first time it is touched: rounds of writing a large buffer twice,
freshly allocated each round (the first write faults its pages in, the second finds them
resident), in GB/s, each round after a pause of its own.

    python3 bench/probes/first_touch_probe.py [--gib 4] [--pauses 0,0,10,0] [--out F]

On a virtual machine whose host backs the guest's memory only when it is first touched, and
takes back what the guest frees (virtio-balloon's free page reporting, which reports freed
pages after about two seconds), a round's first write is slow unless the round before freed
its pages just before: the first round, and any round after a pause, pay the host's faults.
Elsewhere the rounds agree. `bench/machine_probe.sh` runs it on each start of the GPU machine,
where the first rounds of a fresh start were often the slowest.

A probe: prints a table, asserts nothing about speed.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np


def timed_fill(a, value):
    start = time.perf_counter()
    a.fill(value)
    return a.nbytes / (time.perf_counter() - start) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4)
    ap.add_argument("--pauses", default="0,0,10,0", help="seconds before each round")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    try:
        pauses = [float(p) for p in args.pauses.split(",")]
    except ValueError:
        ap.error(f"--pauses {args.pauses!r}: seconds separated by commas")

    rows = []
    for pause in pauses:
        time.sleep(pause)
        a = np.empty(int(args.gib * (1 << 30)), dtype=np.uint8)
        first = timed_fill(a, 1)
        rows.append(
            dict(pause_s=pause, first_write_gbps=first, resident_write_gbps=timed_fill(a, 2))
        )
        del a
    print(f"{args.gib:g} GiB a round, GB/s: pause before it, first write, resident write")
    for r in rows:
        print(
            f"{r['pause_s']:5.0f} s  {r['first_write_gbps']:6.2f}  {r['resident_write_gbps']:6.2f}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(dict(gib=args.gib, rounds=rows), indent=1))


if __name__ == "__main__":
    main()
