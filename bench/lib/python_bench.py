"""pinfeed's Python API beside torch, in one run on the GPU machine.

python3 bench/records.py python --npy DATA.npy --pinfeed-bin .device-carry/pinfeed --out out.json

- the seed tensor: pinfeed.to_device(a) against a.cuda(), a.pin_memory().cuda() and the per-row
  variants; pinfeed.pinned(a) + a.cuda(non_blocking=True);
- the .npy file: pinfeed.Loader (sequential) against the DataLoader variants and against
  `pinfeed stream` on the same file (the Python layer's cost);
- pinfeed.prefetch(DataLoader(pin_memory=False)) against DataLoader(pin_memory=True);
- correctness: every timed path is checked against the source.
"""

import argparse
import json
import subprocess
import time

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader

import pinfeed
from lib.torch_baselines import WholeBatch, timed


def row(name, nbytes, wall, cpu, **extra):
    r = {"name": name, "wall_s": wall, "cpu_s": cpu, "gbps": nbytes / wall / 1e9}
    r.update(extra)
    print(f"{name:<58} {wall * 1e3:9.1f} ms {cpu * 1e3:9.1f} ms CPU {r['gbps']:7.2f} GB/s")
    return r


def upload_through(stager, x):
    """`x` to the GPU through `stager` (`to_device` with an arena and copy threads of one's own)."""
    return pinfeed.staging._materialize_staged(pinfeed.staging._upload_leaf(x, stager.upload))


def seed(rows, cols):
    a = torch.rand(rows, cols)
    n = a.numel() * 4
    out = []
    variants = {
        "a.cuda()": lambda: a.cuda(),
        "a.pin_memory().cuda()": lambda: a.pin_memory().cuda(),
        "rows: i.pin_memory().cuda(non_blocking=True)": lambda: [
            i.pin_memory().cuda(non_blocking=True) for i in a
        ],
        "rows: i.cuda()": lambda: [i.cuda() for i in a],
        "pinfeed.to_device(a)": lambda: pinfeed.to_device(a, device="cuda"),
        "pinfeed.to_device(a, method='both')": lambda: pinfeed.to_device(
            a, device="cuda", method="both"
        ),
        "pinfeed.to_device(a, method='register')": lambda: pinfeed.to_device(
            a, device="cuda", method="register"
        ),
        "pinfeed.to_device(a, pinned_budget=256MiB)": lambda: pinfeed.to_device(
            a, device="cuda", pinned_budget="256MiB"
        ),
        "pinfeed.to_device(a, pinned_budget=1GiB)": lambda: pinfeed.to_device(
            a, device="cuda", pinned_budget="1GiB"
        ),
    }
    for name, fn in variants.items():
        fn()
        wall, cpu = timed(fn)
        out.append(row(name, n, wall, cpu))
    # Is torch's OpenMP pool (spinning after the variants above) what slows to_device from
    # Python against `pinfeed bench`? The same call with torch held to one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        wall, cpu = timed(variants["pinfeed.to_device(a)"])
        out.append(row("pinfeed.to_device(a), torch.set_num_threads(1)", n, wall, cpu))
    finally:
        torch.set_num_threads(threads)
    # The arena's copy threads: one per core is the default (the fastest); fewer trade rate
    # for CPU time (the CPU-time target is a quarter of torch's best per-row variant).
    for threads in [4, 5, 6, 8]:
        st = pinfeed._pinfeed.Stager("cuda", None, threads, "stage")
        upload_through(st, a)
        wall, cpu = timed(lambda: upload_through(st, a))
        out.append(row(f"pinfeed.to_device(a) with {threads} copy threads", n, wall, cpu))
        del st
    with pinfeed.pinned(a):
        wall, cpu = timed(lambda: a.cuda(non_blocking=True))
        out.append(row("with pinfeed.pinned(a): a.cuda(non_blocking=True)", n, wall, cpu))
        pinfeed.to_device(a, device="cuda")
        wall, cpu = timed(lambda: pinfeed.to_device(a, device="cuda"))
        out.append(row("with pinfeed.pinned(a): pinfeed.to_device(a)", n, wall, cpu))
    counters = {}
    for method in ["both", "stage", "register"]:
        got = pinfeed.to_device(a, device="cuda", method=method)
        assert torch.equal(got.cpu(), a), f"to_device(method={method!r}) delivered wrong values"
        del got
        counters[method] = pinfeed.staging._shared_stager("cuda", None, method).counters()
    print("to_device counters:", counters)
    return {"bytes": n, "variants": out, "counters": counters, "caps": caps(a)}


def caps(a):
    """What bounds a pageable source's trip to the GPU on this machine: the CPU copy rate with
    every core (torch's multi-threaded copy_, alone and while the copy engine reads pinned memory
    on a side stream), the driver's register + unregister rate for touched pages in 32 MiB
    chunks, and the plain pinned copy rate."""
    cudart = torch.cuda.cudart()
    n = a.numel() * 4
    dst = torch.empty_like(a)
    dst.copy_(a)
    wall, _ = timed(lambda: dst.copy_(a))
    memcpy = n / wall / 1e9
    pinned = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    wall_pinned, _ = timed(lambda: dev.copy_(pinned, non_blocking=True))
    with torch.cuda.stream(side):
        for _ in range(int(3 * memcpy / 50) + 8):  # keep the copy engine busy through the memcpy
            dev.copy_(pinned, non_blocking=True)
    t0 = time.perf_counter()
    dst.copy_(a)
    memcpy_busy = n / (time.perf_counter() - t0) / 1e9
    side.synchronize()
    chunk = 32 << 20
    base = a.data_ptr()

    def register_all():
        for off in range(0, n - chunk + 1, chunk):
            assert cudart.cudaHostRegister(base + off, chunk, 0) == 0
        for off in range(0, n - chunk + 1, chunk):
            assert cudart.cudaHostUnregister(base + off) == 0

    wall_reg, cpu_reg = timed(register_all)
    r = {
        "memcpy_all_cores_gbps": memcpy,
        "memcpy_while_copy_engine_reads_gbps": memcpy_busy,
        "register_unregister_gbps": (n // chunk * chunk) / wall_reg / 1e9,
        "pinned_copy_1gib_gbps": (1 << 30) / wall_pinned / 1e9,
        "torch_threads": torch.get_num_threads(),
    }
    print("caps:", {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()})
    return r


def loaders(npy, batch_size, pinfeed_bin):
    mm = np.load(npy, mmap_mode="r")
    n = mm.size
    out = []

    def consume(it):
        total = 0
        for x in it:
            total += x.numel()
        torch.cuda.synchronize()
        return total

    for reader in ["pread", "register"]:  # register: straight from the registered file mapping
        loader = pinfeed.Loader(npy, batch_size, device="cuda", reader=reader)
        consume(loader)
        wall, cpu = timed(lambda: consume(loader), repeat=3)  # each pass reuses the pinned pool
        out.append(
            row(
                f"pinfeed.Loader(npy, {batch_size}) reader={reader}",
                n,
                wall,
                cpu,
                stats=loader.stats(),
            )
        )

    def seq(pin):
        return DataLoader(
            WholeBatch(mm),
            sampler=BatchSampler(range(len(mm)), batch_size, False),
            batch_size=None,
            pin_memory=pin,
        )

    wall, cpu = timed(lambda: consume(x.cuda(non_blocking=True) for x in seq(True)), repeat=1)
    out.append(row("DataLoader whole-batch sequential, pin_memory=True", n, wall, cpu))

    def prefetched(make, **kw):
        """Times prefetch over a fresh iterable from `make`; with its own account (stats())."""
        p = None

        def run():
            nonlocal p
            p = pinfeed.prefetch(make(), device="cuda", **kw)
            return consume(p)

        wall, cpu = timed(run, repeat=1)
        print("   ", p.stats()["bottleneck"])
        return wall, cpu, p.stats()

    for depth in [2, 4]:
        wall, cpu, stats = prefetched(lambda: seq(False), depth=depth)
        name = "pinfeed.prefetch(DataLoader(pin_memory=False))" + (
            f", depth={depth}" if depth != 2 else ""
        )
        out.append(row(name, n, wall, cpu, stats=stats))
    # What the DataLoader itself delivers, with no copy at all: the ceiling for both above.
    wall, cpu = timed(lambda: sum(x.numel() for x in seq(False)), repeat=1)
    out.append(row("DataLoader whole-batch sequential, pin_memory=False, no copy", n, wall, cpu))

    # With worker processes (and so DataLoader's own pin-memory thread).
    def workers(pin):
        return DataLoader(
            WholeBatch(mm),
            sampler=BatchSampler(range(len(mm)), batch_size, False),
            batch_size=None,
            pin_memory=pin,
            num_workers=4,
            prefetch_factor=4,
        )

    wall, cpu = timed(lambda: consume(x.cuda(non_blocking=True) for x in workers(True)), repeat=1)
    out.append(row("DataLoader whole-batch, 4 workers, pin_memory=True", n, wall, cpu))
    wall, cpu, stats = prefetched(lambda: workers(False))
    out.append(
        row("pinfeed.prefetch(DataLoader(4 workers, pin_memory=False))", n, wall, cpu, stats=stats)
    )
    wall, cpu = timed(lambda: sum(x.numel() for x in workers(False)), repeat=1)
    out.append(row("DataLoader whole-batch, 4 workers, pin_memory=False, no copy", n, wall, cpu))
    got = list(pinfeed.prefetch(seq(False), device="cuda"))
    assert sum(int(x.shape[0]) for x in got) == len(mm) and torch.equal(
        got[-1].cpu(), torch.from_numpy(np.array(mm[-got[-1].shape[0] :]))
    )
    del got
    # The same file through the command, for the Python layer's cost.
    cli = []
    for _ in range(3):
        r = json.loads(
            subprocess.check_output(
                [
                    pinfeed_bin,
                    "stream",
                    npy,
                    "--batch-size",
                    str(batch_size),
                    "--reader",
                    "pread",
                    "--json",
                ]
            )
        )
        cli.append(r)
    cli.sort(key=lambda r: r["seconds"])
    best = cli[1]
    out.append(
        row(
            f"pinfeed stream (command, reader={best['reader']})",
            n,
            best["seconds"],
            best["cpu_seconds"],
        )
    )
    # Correctness of the Python path: every batch equals the file.
    loader = pinfeed.Loader(npy, batch_size, device="cuda")
    at = 0
    for x in loader:
        k = x.shape[0]
        if at % (50 * batch_size) == 0 or at + k == len(mm):
            assert torch.equal(x.cpu(), torch.from_numpy(np.array(mm[at : at + k]))), (
                f"batch at record {at} differs"
            )
        at += k
    assert at == len(mm)
    return out


def batch_sizes(pinfeed_bin, repeat=3):
    """Batches of 1 MiB to 256 MiB against a plain pinned copy_ of the same size, in the same
    run (the target: each at least 85% of the pinned rate): pinfeed.Loader over a host array (with
    4 MiB pieces, the default, and with whole-batch slots), and `pinfeed stream` over a
    page-cached file of the same bytes (no Python per batch; rate after start-up)."""
    out = []
    total = 2 << 30
    src = np.random.default_rng(0).integers(0, 255, size=total, dtype=np.uint8).reshape(-1, 4096)
    path = "/tmp/pinfeed-batches-2g.npy"
    np.save(path, src)
    with open(path, "rb") as f:  # page-cached from here on
        while f.read(64 << 20):
            pass
    for mib in [1, 4, 16, 64, 256]:
        rows = mib * 256  # records of 4096 bytes
        pinned = torch.empty(mib << 20, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
        n = total // (mib << 20)
        wall_pinned, _ = timed(
            lambda: [dst.copy_(pinned, non_blocking=True) for _ in range(n)], repeat
        )
        r = {"batch_mib": mib, "pinned_copy_gbps": total / wall_pinned / 1e9}
        # The default (batches over 4 MiB in 4 MiB pieces) and whole-batch slots.
        for key, piece_size in [("loader_gbps", "4MiB"), ("loader_whole_gbps", None)]:
            loader = pinfeed.Loader(
                src,
                rows,
                device="cuda",
                pinned_budget=max(256 << 20, 8 * (mib << 20)),
                piece_size=piece_size,
            )

            def run():
                for _x in loader:
                    pass

            run()
            wall, cpu = timed(run, repeat)
            r[key] = total / wall / 1e9
        r["ratio"] = r["loader_gbps"] / r["pinned_copy_gbps"]
        runs = []
        for _ in range(repeat):
            cmd = [
                pinfeed_bin,
                "stream",
                path,
                "--batch-size",
                str(rows),
                "--reader",
                "pread",
                "--json",
                "--pinned-budget",
                str(max(256 << 20, 8 * (mib << 20))),
            ]
            runs.append(json.loads(subprocess.check_output(cmd)))
        runs.sort(key=lambda j: j["streaming_gbps"])
        r["stream_gbps"] = runs[len(runs) // 2]["streaming_gbps"]
        r["stream_ratio"] = r["stream_gbps"] / r["pinned_copy_gbps"]
        print(
            f"batch {mib:4d} MiB: pinned copy_ {r['pinned_copy_gbps']:6.2f} GB/s, Loader {r['loader_gbps']:6.2f} GB/s ({r['ratio']:.0%}), "
            f"whole-batch slots {r['loader_whole_gbps']:6.2f} GB/s, pinfeed stream {r['stream_gbps']:6.2f} GB/s ({r['stream_ratio']:.0%})"
        )
        out.append(r)
    return out


def sweep(rows, cols, repeat=3):
    """How the pinned working set and the thread counts set the rate (the defaults come from
    this): to_device's arena size and copy threads for the seed tensor, two interleaved rounds;
    the Loader's reader threads for 1 MiB and 4 MiB batches from a host array."""
    a = torch.rand(rows, cols)
    n = a.numel() * 4
    out = {"to_device": [], "loader": []}
    for round_ in range(2):
        for arena_mib in [32, 64, 128, 256]:
            for threads in [16, 12]:
                st = pinfeed._pinfeed.Stager("cuda", arena_mib << 20, threads, "stage", None)
                upload_through(st, a)
                wall, cpu = timed(lambda: upload_through(st, a), repeat)
                r = {
                    "round": round_,
                    "arena_mib": arena_mib,
                    "threads": threads,
                    "gbps": n / wall / 1e9,
                    "cpu_s": cpu,
                }
                print(
                    f"to_device arena {arena_mib:4d} MiB threads {threads:2d}: {r['gbps']:6.2f} GB/s, {cpu * 1e3:6.0f} ms CPU"
                )
                out["to_device"].append(r)
                del st
    small = pinfeed._pinfeed.Stager("cuda", 16 << 20, None, "stage", "4MiB")
    got = upload_through(small, a)
    assert torch.equal(got.cpu(), a), "to_device through a 16 MiB arena delivered wrong values"
    del got, small, a
    total = 2 << 30
    src = np.random.default_rng(0).integers(0, 255, size=total, dtype=np.uint8).reshape(-1, 4096)
    for mib in [1, 4]:
        for threads in [8, 12, 16]:
            loader = pinfeed.Loader(src, mib * 256, device="cuda", num_threads=threads)

            def run():
                for _x in loader:
                    pass

            run()
            wall, cpu = timed(run, repeat)
            st = loader.stats()
            r = {
                "batch_mib": mib,
                "threads": threads,
                "gbps": total / wall / 1e9,
                "bottleneck": st.get("explanation"),
                "stats": {k: v for k, v in st.items() if isinstance(v, (int, float))},
            }
            print(
                f"Loader batch {mib} MiB threads {threads:2d}: {r['gbps']:6.2f} GB/s  {r['bottleneck']}"
            )
            out["loader"].append(r)
    return out


def overlap(npy, steps=300, batch=4096):
    """A training loop whose GPU step outlasts the batch's copy: GPU idle time with pinfeed
    against DataLoader(pin_memory=True), both shuffled, against data already on the GPU."""
    mm = np.load(npy, mmap_mode="r")
    w = torch.randn(2883, 2883, device="cuda", dtype=torch.float16)

    def step(x):
        y = x.reshape(x.shape[0], -1)[:, :2883].half()
        for _ in range(3):
            y = y @ w
        return y

    resident = torch.from_numpy(np.array(mm[: batch * 8])).cuda()
    xs = [resident[i * batch : (i + 1) * batch] for i in range(8)]
    for x in xs:
        step(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(xs[i % 8])
    torch.cuda.synchronize()
    ideal = time.perf_counter() - t0

    def loop(it):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        k = 0
        for x in it:
            if not x.is_cuda:
                x = x.cuda(non_blocking=True)
            step(x)
            k += 1
            if k == steps:
                break
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    loader = pinfeed.Loader(npy, batch, device="cuda", shuffle=True, seed=1)
    t_pinfeed = loop(iter(loader))
    dl = DataLoader(
        WholeBatch(mm),
        sampler=BatchSampler(torch.randperm(len(mm)).tolist(), batch, False),
        batch_size=None,
        pin_memory=True,
    )
    t_dl = loop(iter(dl))
    r = {
        "steps": steps,
        "batch": batch,
        "gpu_step_ms": ideal / steps * 1e3,
        "data_on_gpu_s": ideal,
        "pinfeed_s": t_pinfeed,
        "dataloader_pin_memory_s": t_dl,
        "pinfeed_gpu_idle": 1 - ideal / t_pinfeed,
        "dataloader_gpu_idle": 1 - ideal / t_dl,
    }
    print(
        f"overlap: GPU step {r['gpu_step_ms']:.2f} ms; GPU idle {r['pinfeed_gpu_idle']:.1%} with pinfeed, "
        f"{r['dataloader_gpu_idle']:.1%} with DataLoader(pin_memory=True)"
    )
    return r


def shuffled(npy, batch=1024):
    """Shuffled records of a page-cached file: random mode (the loader's own thread count, what
    a user gets without `num_threads`, then fixed counts) and GPU-resident mode."""
    mm = np.load(npy, mmap_mode="r")
    n = mm.size
    out = []
    for reader, threads in [("auto", None), ("pread", 16), ("auto", 8), ("auto", 16)]:
        kw = {} if threads is None else {"num_threads": threads}
        loader = pinfeed.Loader(npy, batch, device="cuda", shuffle="random", reader=reader, **kw)
        wall, cpu = timed(lambda: [x for x in loader], repeat=1)
        st = loader.stats()
        count = threads if threads is not None else f"None: {st['threads']}"
        out.append(
            row(
                f"pinfeed.Loader(shuffle='random', num_threads={count}, reader={reader!r}) [{st.get('reader_description', '')}]",
                n,
                wall,
                cpu,
                stats=st,
            )
        )
    resident = pinfeed.Loader(npy, 65536, device="cuda", shuffle="gpu")
    for _x in resident:  # the first pass uploads the dataset once
        pass
    wall, cpu = timed(lambda: [x for x in resident], repeat=3)
    out.append(row("pinfeed.Loader(shuffle='gpu'), batches of 65536, per epoch", n, wall, cpu))
    resident_small = pinfeed.Loader(npy, batch, device="cuda", shuffle="gpu")
    for _x in resident_small:
        pass
    wall, cpu = timed(lambda: [x for x in resident_small], repeat=3)
    out.append(row(f"pinfeed.Loader(shuffle='gpu'), batches of {batch}, per epoch", n, wall, cpu))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--npy", required=True)
    ap.add_argument("--pinfeed-bin", required=True)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=655360)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--sections", default="seed,loaders,batch_sizes,overlap,shuffled"
    )  # also: sweep
    args = ap.parse_args()
    sections = args.sections.split(",")
    torch.cuda.init()
    result = {}
    for name, fn in [
        ("seed", lambda: seed(args.rows, args.cols)),
        ("loaders", lambda: loaders(args.npy, args.batch_size, args.pinfeed_bin)),
        ("batch_sizes", lambda: batch_sizes(args.pinfeed_bin)),
        ("sweep", lambda: sweep(args.rows, args.cols)),
        ("overlap", lambda: overlap(args.npy)),
        ("shuffled", lambda: shuffled(args.npy)),
    ]:
        if name not in sections:
            continue
        try:
            result[name] = fn()
        except Exception as e:  # keep the other measurements; the failure is reported
            import traceback

            traceback.print_exc()
            result[name] = {"error": repr(e)}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
