"""JAX's own ways of feeding a jitted training step, beside pinfeed's framework="jax".

    python3 bench/records.py jax --npy /tmp/pinfeed-4g.npy [--batch 4096] [--hidden 512,640,768,1024,2048]
                               [--epochs 3] [--rounds 2] [--out results.json]

Runs on a CUDA machine with jax (CUDA plugin) and the pinfeed wheel, over the seed-shaped file
(uint8 records of 3 x 31 x 31, page-cached first). For each hidden width, one epoch of
batches through the same jitted step (uint8 -> float, a (record_bytes x hidden) layer, the
gradient of a squared output, an SGD update), for --epochs epochs, fed four ways:

- device_put:        numpy batches sliced from a memmap, ``jax.device_put`` each;
- device_put+thread: the same on a background thread, a few batches ahead (queue of 4);
- pinfeed:           ``pinfeed.Loader(path, batch, framework="jax", epochs=...)``, made
                     before the timed region (as the memmap is opened before it);
- pinfeed+start:     the same with the Loader made inside the timed region (its start:
                     page-locking its pool, the readers' first batches);
- bound:             the same number of steps on one batch already on the device.

A last row, ``pinfeed alone``, takes pinfeed's arrays with no step (the feed's own rate).
Each row reports GB/s (file bytes per second, the last step's result waited for) and its share
of the bound (bound seconds / row seconds). Rounds are interleaved; the best of
each row is kept. A short table is printed and everything is written as JSON to --out.
"""

import argparse
import json
import os
import queue
import threading
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # pinfeed allocates too

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pinfeed  # noqa: E402
from lib.rates import machine_rates  # noqa: E402


def make_step(record_bytes, hidden):
    """A jitted SGD step on (w, batch): its cost grows with ``hidden``."""
    w0 = jnp.zeros((record_bytes, hidden), jnp.float32)

    def loss(w, x):
        x = x.reshape(x.shape[0], -1).astype(jnp.float32) * (1 / 255)
        return jnp.mean((x @ w) ** 2)

    @jax.jit
    def step(w, x):
        return w - 1e-3 * jax.grad(loss)(w, x)

    return w0, step


def batches_device_put(mm, batch, device, epochs):
    for _ in range(epochs):
        for i in range(0, len(mm), batch):
            yield jax.device_put(np.asarray(mm[i : i + batch]), device)


def batches_threaded(mm, batch, device, epochs, depth=4):
    q = queue.Queue(maxsize=depth)
    end = object()

    def produce():
        for x in batches_device_put(mm, batch, device, epochs):
            q.put(x)
        q.put(end)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    while (x := q.get()) is not end:
        yield x
    t.join()


# The last Loader made, whose stats() give the machine's rates for the report.
LAST = {}


def loader(path, batch, epochs):
    """pinfeed's Loader, made (its pool page-locked, its readers started) on the call."""
    LAST["loader"] = pinfeed.Loader(path, batch, device="cuda", framework="jax", epochs=epochs)
    return LAST["loader"]


def batches_pinfeed_started(path, batch, epochs):
    """The same Loader, made on the first batch's request (inside the timed region)."""
    yield from loader(path, batch, epochs)


def batches_bound(mm, batch, device, epochs):
    x = jax.device_put(np.asarray(mm[:batch]), device)
    for _ in range(epochs):
        for _ in range(0, len(mm), batch):
            yield x


def no_step(w, x):
    """The ``pinfeed alone`` row's step: keeps the array, so the last one is waited for."""
    return x


def run(step, w, batches):
    """Seconds to run ``step`` over ``batches`` (the last result waited for), and steps."""
    t0 = time.perf_counter()
    n = 0
    for x in batches:
        w = step(w, x)
        n += 1
    w.block_until_ready()
    return time.perf_counter() - t0, n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--npy", default="/tmp/pinfeed-4g.npy")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument(
        "--hidden", default="512,640,768,1024,2048", help="widths of the layer, comma-separated"
    )
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    device = jax.devices("gpu")[0]
    mm = np.load(args.npy, mmap_mode="r")
    record_bytes = int(np.prod(mm.shape[1:])) * mm.dtype.itemsize
    file_bytes = len(mm) * record_bytes
    epochs = args.epochs
    with open(args.npy, "rb") as f:  # page-cached from here on
        while f.read(1 << 26):
            pass
    ways = {
        "device_put": lambda: batches_device_put(mm, args.batch, device, epochs),
        "device_put+thread": lambda: batches_threaded(mm, args.batch, device, epochs),
        "pinfeed": lambda: loader(args.npy, args.batch, epochs),
        "pinfeed+start": lambda: batches_pinfeed_started(args.npy, args.batch, epochs),
        "bound": lambda: batches_bound(mm, args.batch, device, epochs),
        "pinfeed alone": lambda: loader(args.npy, args.batch, epochs),
    }
    results = []
    for hidden in [int(h) for h in args.hidden.split(",")]:
        w, step = make_step(record_bytes, hidden)
        # Compiled for both batch shapes (a partial last batch is its own) before timing.
        run(step, w, batches_bound(mm[: args.batch * 3], args.batch, device, 1))
        if len(mm) % args.batch:
            run(step, w, [jax.device_put(np.asarray(mm[-(len(mm) % args.batch) :]), device)])
        best = {}
        for _ in range(args.rounds):
            for name, make in ways.items():
                seconds, steps = run(no_step if name == "pinfeed alone" else step, w, make())
                assert steps == epochs * -(-len(mm) // args.batch), (name, steps)
                best[name] = min(best.get(name, float("inf")), seconds)
        for name, seconds in best.items():
            results.append(
                dict(
                    hidden=hidden,
                    way=name,
                    seconds=seconds,
                    gbps=epochs * file_bytes / seconds / 1e9,
                    share_of_bound=best["bound"] / seconds,
                    vs_device_put=best["device_put"] / seconds,
                )
            )
    print(f"{'hidden':>6} {'way':<18} {'s':>7} {'GB/s':>7} {'of bound':>9} {'x device_put':>12}")
    for r in results:
        print(
            f"{r['hidden']:>6} {r['way']:<18} {r['seconds']:7.3f} {r['gbps']:7.2f} "
            f"{r['share_of_bound']:9.1%} {r['vs_device_put']:12.2f}"
        )
    report = dict(
        file=args.npy,
        file_bytes=file_bytes,
        records=len(mm),
        record_bytes=record_bytes,
        batch=args.batch,
        epochs=epochs,
        rounds=args.rounds,
        jax=jax.__version__,
        device=str(device),
        pinfeed=pinfeed.__version__,
        machine=machine_rates(LAST["loader"].stats()),
        results=results,
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
