"""Two builds of pinfeed side by side on the GPU machine, interleaved, with torch's copies as the
bus's reference in the same run.

    python3 bench/records.py ab --build old=/tmp/site-old --build new=/tmp/site-new \
        [--rounds 3] [--npy /tmp/pinfeed-4g.npy] [--out ab.json]

Each build is a folder holding an installed `pinfeed` (`pip install --target DIR wheel`). Every
round runs each build in a fresh process (so neither inherits the other's pinned pool or CUDA
state) over the same rows:

- `to_device` of the seed tensor (1024 x 655,360 float32, 2.68 GB, pageable);
- a `Loader` pass over the page-cached 4 GiB `.npy` of 3x31x31 uint8 records, batches of 1024,
  in order and shuffled (`shuffle="random"`);
- a `Loader` over a host array in batches of 1 MiB;
- GPU-resident shuffling (`shuffle="gpu"`) of the same file, batches of 65,536, once uploaded;
- `TokenLoader` random windows at nanoGPT's 12 x 1024 and 64 x 4096, in batches a second;
- torch's pinned `copy_` of the same sizes (the bus), so each row is also a share of the bus.

Every row checks what it delivered (column sums against numpy's) before it is timed.
Each row records the host's CPU, the loader's rates and thread count, its slot claims, the
process's CPU seconds a GB delivered (`cpu_s_per_gb`), and the share of the machine's CPU time
the hypervisor stole while it was timed (`steal_share`). A host busy with other guests shows in
the last; a host whose cores or memory run slower, for the same code and bytes, in the one
before.

`--device cpu --small` runs the same rows on the host backend at small sizes (a 16 MiB seed
tensor and host array, a file of 20,000 records where `--npy` does not exist yet), with torch's
host-to-host `copy_` as the reference: how the tests run this script on a machine without a
GPU. Its figures are not the bus's.
"""

import argparse
import json
import os
import subprocess
import sys

RECORDS = 1489700  # 4 GiB of 3x31x31 uint8 records
ROWS, COLS = 1024, 655360
# Each build's worker runs through the workload script, which puts bench/ on sys.path.
RECORDS_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "records.py")


def sizes(small):
    """The seed tensor's shape, the 1 MiB-batch host array's rows of 1 KiB, the records of a
    file written where `--npy` is absent, and the copies each row's reference times (bytes,
    copies a run): the benchmark's, or `--small`'s."""
    if small:
        return {
            "seed": (64, 65536),
            "host_rows": 16384,
            "records": 20000,
            "bus_seed": (16 << 20, 3),
            "bus_file": (4 << 20, 16),
            "bus_host": (1 << 20, 16),
            "token_bytes": 8 << 20,
        }
    return {
        "seed": (ROWS, COLS),
        "host_rows": 1 << 20,
        "records": RECORDS,
        "bus_seed": (1 << 30, 3),
        "bus_file": (4 << 20, 256),
        "bus_host": (1 << 20, 1024),
        "token_bytes": 1 << 30,
    }


def loader_kwargs(device):
    """The `Loader` arguments of a row on `device`: torch tensors on the host backend too, so
    that one check reads both."""
    return {"device": device} if device != "cpu" else {"device": device, "framework": "torch"}


def drain(loader, check=None):
    """Every batch of one pass; `check` gets the column sums of what arrived."""
    import torch

    total = None
    for x in loader:
        if check is not None:
            s = x.reshape(x.shape[0], -1).sum(dim=0, dtype=torch.int64)
            total = s if total is None else total + s
    if check is not None:
        check(total)


def sums_check(array, what):
    """A `check` for `drain`: the column sums of what arrived (records flattened) must equal
    `array`'s, else the assertion names `what`."""
    import numpy as np
    import torch

    want = torch.from_numpy(np.asarray(array.reshape(len(array), -1).sum(axis=0, dtype=np.int64)))

    def check(total):
        assert torch.equal(total.cpu(), want), f"{what}: the Loader delivered other bytes"

    return check


def share(part, whole):
    """`part / whole`, or None where either is missing or `whole` is zero."""
    return part / whole if part is not None and whole else None


def per_batch_us(stats):
    """The copy thread's and the consumer's time a batch (µs) in a Loader's `stats()`, or None
    for a stager's counters (to_device)."""
    if not stats.get("batches"):
        return None
    keys = ["elapsed", "copy_issue_time", "wait_filled", "wait_consumer", "consumer_wait"]
    return {k: stats[k] / stats["batches"] * 1e6 for k in keys}


def measure(fn):
    """Wall and CPU seconds of `fn` (the median of a few runs, the device synchronised) and the
    share of the machine's CPU time stolen by the hypervisor meanwhile."""
    from lib.rates import cpu_times, steal_share
    from lib.torch_baselines import timed

    before = cpu_times()
    wall, cpu = timed(fn)
    return wall, cpu, steal_share(before, cpu_times())


def worker(npy, label, device, small, groups=("bus", "tokens")):
    import numpy as np
    import torch

    import pinfeed
    from lib.rates import host_cpu
    from lib.torch_baselines import bus_rate

    rows = []
    machine_cpu = host_cpu()
    size = sizes(small)

    def row(name, nbytes, timing, bus, loader=None):
        wall, cpu, steal = timing
        gbps = nbytes / wall / 1e9
        # A Loader's stats, or a stager's counters (to_device): threads and the machine's rates.
        if loader is None:
            st = {}
        elif hasattr(loader, "stats"):
            st = loader.stats()
        else:
            st = loader.counters()
        rows.append(
            {
                "threads": st.get("threads"),
                "threads_reason": st.get("threads_reason"),
                "copy_gbps": st.get("copy_gbps"),
                "machine_bus_gbps": st.get("bus_gbps"),
                "slots": st.get("slots"),
                "bottleneck": st.get("bottleneck"),
                # A Loader's claims of a slot: the share that got back one of the reader's own,
                # and the share that waited for one.
                "own_slot_share": share(st.get("slot_claims_own"), st.get("slot_claims")),
                "slot_wait_share": share(st.get("slot_waits"), st.get("slot_claims")),
                # A Loader's pass, per batch: where its copy thread's time went (issuing copies,
                # waiting for a filled piece, waiting for the consumer to take a batch) and the
                # consumer's wait for a batch, in microseconds.
                "per_batch_us": per_batch_us(st),
                "build": label,
                "name": name,
                "gbps": gbps,
                "cpu_s": cpu,
                "cpu_s_per_gb": cpu / (nbytes / 1e9),
                "bus_gbps": bus,
                "share_of_bus": share(gbps, bus),
                "host_cpu": machine_cpu,
                "steal_share": steal,
            }
        )

    if "bus" in groups:  # the rows that are a share of the bus
        # The seed tensor.
        a = torch.rand(*size["seed"])
        want = a.sum(dim=0, dtype=torch.float64)
        got = torch.as_tensor(pinfeed.to_device(a, device=device))  # numpy on the host backend
        assert torch.equal(got.sum(dim=0, dtype=torch.float64).cpu(), want), "to_device differs"
        del got
        timing = measure(lambda: pinfeed.to_device(a, device=device))
        stager = pinfeed.staging._shared_stager(device, None)
        bus = bus_rate(*size["bus_seed"], device)
        row("seed tensor: to_device(a)", a.numel() * 4, timing, bus, stager)
        del a

        # The 4 GiB file, in order and shuffled.
        data = np.load(npy, mmap_mode="r")
        check = sums_check(data, npy)
        nbytes = data.nbytes
        bus = bus_rate(*size["bus_file"], device)

        for shuffle in ["none", "random"]:
            loader = pinfeed.Loader(npy, 1024, shuffle=shuffle, seed=1, **loader_kwargs(device))
            drain(loader, check)
            timing = measure(lambda loader=loader: drain(loader))
            row(f"4 GiB .npy, shuffle={shuffle}", nbytes, timing, bus, loader)

        # Batches of 1 MiB from a host array.
        shape = (size["host_rows"], 1024)
        host = np.random.default_rng(0).integers(0, 255, size=shape, dtype=np.uint8)
        loader = pinfeed.Loader(host, 1024, **loader_kwargs(device))
        drain(loader, sums_check(host, "the host array"))
        timing = measure(lambda: drain(loader))
        bus = bus_rate(*size["bus_host"], device)
        row("1 MiB batches from a host array", host.nbytes, timing, bus, loader)
        del host, loader

        # GPU-resident shuffling: the file uploaded once, then epochs gathered on the device.
        loader = pinfeed.Loader(npy, 65536, shuffle="gpu", seed=1, **loader_kwargs(device))
        drain(loader, check)  # the upload and a first epoch, checked
        timing = measure(lambda: drain(loader))
        row("4 GiB .npy, shuffle=gpu (epochs)", nbytes, timing, bus, loader)
        del loader

    if "tokens" in groups:
        # Token windows, nanoGPT's shapes, random windows: batches a second.
        tokens = token_file(npy, size["token_bytes"])
        corpus = np.memmap(tokens, dtype=np.uint16, mode="r")
        for b, t, steps in [(12, 1024, 20000), (64, 4096, 4000)]:
            steps = steps if not small else 200
            # Positional source and dtype: a spelling every build takes.
            loader = pinfeed.TokenLoader(tokens, t, b, dtype="uint16", steps=steps, device=device)
            x, _ = next(iter(loader))
            start = int(loader.offsets(0, epoch=0)[0])
            assert np.array_equal(
                np.asarray(torch.as_tensor(x)[0].cpu()), corpus[start : start + t]
            )
            timing = measure(lambda loader=loader: sum(1 for _ in loader))
            row(f"tokens {b}x{t}, random windows", b * (t + 1) * 2 * steps, timing, None, loader)
            rows[-1]["batches_per_s"] = steps / timing[0]
    print(json.dumps(rows))


def token_file(npy, nbytes):
    """A raw uint16 token file of random tokens beside `npy`, made once and page-cached."""
    import numpy as np

    path = npy + f".tokens-{nbytes}.bin"
    if not os.path.exists(path):
        rng = np.random.default_rng(2)
        rng.integers(0, 50257, size=nbytes // 2, dtype=np.uint16).tofile(path)
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    return path


def in_turns(rounds, runs, out=None):
    """The rows of every run of `runs` (LABEL, ARGV, ENV: a Python worker that prints its rows as
    a JSON list on its last line), `rounds` times, each round in the reverse order of the last so
    that no run always goes first; each row gets its round. A failed run is printed and skipped.
    The rows so far are written to `out` (JSON) after every run, so that a run cut short by a
    time limit keeps the rounds it finished."""
    results = []
    for r in range(rounds):
        order = runs if r % 2 == 0 else list(reversed(runs))
        for label, argv, env in order:
            proc = subprocess.run(
                [sys.executable, *argv], env=env, capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                print(f"round {r + 1} {label}: FAILED\n{proc.stderr[-3000:]}")
                continue
            for x in json.loads(proc.stdout.strip().splitlines()[-1]):
                x["round"] = r + 1
                results.append(x)
            if out:
                with open(out, "w") as f:
                    json.dump(results, f, indent=1)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--build", action="append", default=[], help="LABEL=DIR of an installed pinfeed"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--npy", default="/tmp/pinfeed-4g.npy")
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--small", action="store_true", help="small sizes (see above)")
    ap.add_argument(
        "--rows",
        default="bus,tokens",
        help="row groups: bus (to_device, the file, 1 MiB batches, shuffle=gpu), tokens",
    )
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.npy, args.worker, args.device, args.small, args.rows.split(","))
    if not os.path.exists(args.npy):
        import numpy as np

        rng = np.random.default_rng(1)
        records = sizes(args.small)["records"]
        m = np.lib.format.open_memmap(args.npy, "w+", np.uint8, (records, 3, 31, 31))
        for i in range(0, records, 65536):
            m[i : i + 65536] = rng.integers(0, 255, size=m[i : i + 65536].shape, dtype=np.uint8)
        m.flush()
        del m
    with open(args.npy, "rb") as f:  # page-cached from here on
        while f.read(64 << 20):
            pass
    builds = dict(b.split("=", 1) for b in args.build)
    flags = ["--device", args.device, "--rows", args.rows] + (["--small"] if args.small else [])
    runs = [
        (
            label,
            [RECORDS_PY, "ab", "--worker", label, "--npy", args.npy, *flags],
            dict(os.environ, PYTHONPATH=site),
        )
        for label, site in builds.items()
    ]
    results = in_turns(args.rounds, runs, args.out)
    names = list(dict.fromkeys(x["name"] for x in results))

    def table(cell):
        """A line a row, a column a build: `cell` of that build's rows of it, round by round."""
        print(f"{'row':<36}" + "".join(f"{b:>26}" for b in builds))
        for n in names:
            cells = [
                cell([x for x in results if x["name"] == n and x["build"] == b]) for b in builds
            ]
            print(f"{n:<36}" + "".join(f"{c:>26}" for c in cells))

    def rates(rs):
        g = "/".join(f"{x['gbps']:.1f}" for x in rs)
        if rs and rs[0].get("batches_per_s") is not None:
            return "/".join(f"{x['batches_per_s']:.0f}" for x in rs) + " batches/s"
        s = "/".join(f"{100 * x['share_of_bus']:.0f}" for x in rs)
        return f"{g} GB/s ({s}%)"

    table(rates)
    print("CPU seconds a GB delivered (the process's, all threads):")
    table(lambda rs: "/".join(f"{x['cpu_s_per_gb']:.3f}" for x in rs))
    steals = [x["steal_share"] for x in results if x.get("steal_share") is not None]
    if steals:
        print(f"CPU time stolen by the hypervisor in a timed row: at most {max(steals):.1%}")


if __name__ == "__main__":
    main()
