"""Where the CPU goes when pinfeed reads from an S3 server on 127.0.0.1: GB/s and CPU seconds
per GB of the client process and of the server, for the server-limit probes of
`store_bench.py` (parallel ranged GETs into a reused buffer, of all the shards and of one),
pinfeed's `Loader` with the consumer's checksum per batch (as
`store_bench.py` times it) and with nothing done per batch. On a machine where the server and
the readers share few cores, it says how much of a gap to the limit is the client's CPU.

    python3 bench/probes/store_cpu_probe.py [--rounds 2] [--out F]

A probe: prints a table, asserts nothing about speed (each row's bytes are checked).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import store_bench as sb  # noqa: E402  (bench/ holds the shared helpers)

TICK = os.sysconf("SC_CLK_TCK")


def server_cpu(pid):
    """The server process's user and system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def measured(pid, fn):
    """Runs ``fn`` (which returns bytes moved) and returns its GB/s and CPU seconds a GB."""
    c0, s0, t0 = time.process_time(), server_cpu(pid), time.perf_counter()
    n = fn()
    wall = time.perf_counter() - t0
    client, server = time.process_time() - c0, server_cpu(pid) - s0
    return dict(
        gbps=n / wall / 1e9,
        wall_s=wall,
        client_cpu_s_per_gb=client / (n / 1e9),
        server_cpu_s_per_gb=server / (n / 1e9),
        cores_busy=(client + server) / wall,
    )


def loader_passes(source, batch, store, passes, check, want, piece_mib=None):
    import pinfeed

    kw = dict(piece_size=f"{piece_mib}MiB") if piece_mib else {}
    loader = pinfeed.Loader(source, batch, device="cpu", storage_options=store, **kw)

    def run():
        total, n = 0, 0
        for _ in range(passes):
            for b in loader:
                if check:
                    total = (total + sb.checksum(b)) % 2**64
                n += b.nbytes
        if check:
            assert total == want, "pinfeed delivered other bytes"
        return n

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mib", type=int, default=64)
    ap.add_argument("--batch-mib", type=float, default=4)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--piece-mib", type=int, default=None, help="a row with pieces of this size")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    with sb.loopback_shards(args.shards, args.shard_mib) as shards:
        server, bucket, keys = shards.server, shards.bucket, shards.keys
        want = shards.checksum * args.passes % 2**64
        batch = sb.records_in(args.batch_mib)
        store = sb.store_options(server.endpoint)
        source = f"s3://{bucket}/bench/"

        def limit(ks):
            def run():
                start = time.perf_counter()
                gbps = sb.server_limit(server.endpoint, bucket, ks, shards.size)
                return gbps * 1e9 * (time.perf_counter() - start)

            return run

        ways = {
            "server limit, the shards (16 threads, 8 MiB)": limit(keys),
            "server limit, one shard (16 threads, 8 MiB)": limit(keys[:1]),
            "pinfeed, checksum per batch": loader_passes(
                source, batch, store, args.passes, True, want
            ),
            "pinfeed, nothing per batch": loader_passes(
                source, batch, store, args.passes, False, want
            ),
        }
        if args.piece_mib:
            ways[f"pinfeed, nothing per batch, {args.piece_mib} MiB pieces"] = loader_passes(
                source, batch, store, args.passes, False, want, args.piece_mib
            )
        rows = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, fn in ways.items():
                rows[name].append(measured(server.proc.pid, fn))
    best = {name: max(rs, key=lambda r: r["gbps"]) for name, rs in rows.items()}
    print(f"{'way':<48}{'GB/s':>7}{'client s/GB':>13}{'server s/GB':>13}{'cores busy':>12}")
    for name, r in best.items():
        print(
            f"{name:<48}{r['gbps']:>7.3f}{r['client_cpu_s_per_gb']:>13.2f}"
            f"{r['server_cpu_s_per_gb']:>13.2f}{r['cores_busy']:>12.2f}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(dict(best=best, rounds=rows), indent=1))


if __name__ == "__main__":
    main()
