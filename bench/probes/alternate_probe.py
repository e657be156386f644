"""A training and an evaluation `Loader` of different pool sizes used in turn, as a training
loop with an evaluation after each epoch uses them: for each pass, the milliseconds to its
first batch and to its end, and the page-locked allocations the process made during it
(`pinfeed._pinfeed.pinned_allocations`). A pass that page-locks a pool again pays the lock
(on the GPU machine, the driver's registration of the pool) before its first batch.

    PYTHONPATH=SITE python3 bench/probes/alternate_probe.py [--device cuda] [--epochs 6] [--out F]

Run once per build (each wheel installed with `pip install --target SITE`) to compare them.
A probe: prints a table, asserts nothing about speed (each pass's record count is checked).
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np

import pinfeed
from pinfeed import _pinfeed


def timed_pass(loader, records):
    """Milliseconds to the first batch and to the end, and the allocations made meanwhile."""
    before = _pinfeed.pinned_allocations()
    start = time.perf_counter()
    first, n = None, 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        n += len(batch)
    assert n == records, f"a pass delivered {n} records of {records}"
    total = time.perf_counter() - start
    return dict(
        first_batch_ms=first * 1e3,
        pass_ms=total * 1e3,
        pinned_allocations=_pinfeed.pinned_allocations() - before,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--record-bytes", type=int, default=4096)
    ap.add_argument("--train-mib", type=int, default=512, help="the training data's size")
    ap.add_argument("--eval-mib", type=int, default=64, help="the evaluation data's size")
    ap.add_argument("--train-budget", default="256MiB")
    ap.add_argument("--eval-budget", default="64MiB")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    def data(mib, seed):
        n = (mib << 20) // args.record_bytes
        return np.random.default_rng(seed).integers(0, 255, (n, args.record_bytes), np.uint8)

    train, evaluation = data(args.train_mib, 0), data(args.eval_mib, 1)
    loaders = dict(
        train=pinfeed.Loader(
            train, 256, device=args.device, pinned_budget=args.train_budget, shuffle=True
        ),
        eval=pinfeed.Loader(evaluation, 256, device=args.device, pinned_budget=args.eval_budget),
    )
    sizes = dict(train=len(train), eval=len(evaluation))
    passes = []
    for epoch in range(args.epochs):
        for name, loader in loaders.items():
            passes.append(dict(epoch=epoch, loader=name, **timed_pass(loader, sizes[name])))
            passes[-1]["pool_bytes"] = loader.stats()["pinned_bytes"]
    print(f"{'epoch':<7}{'loader':<7}{'first batch ms':>16}{'pass ms':>10}{'page-locked':>13}")
    for p in passes:
        print(
            f"{p['epoch']:<7}{p['loader']:<7}{p['first_batch_ms']:>16.2f}{p['pass_ms']:>10.1f}"
            f"{p['pinned_allocations']:>13}"
        )
    if args.out:
        report = dict(build=pinfeed.__file__, device=args.device, passes=passes)
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
