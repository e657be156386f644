"""Two builds of pinfeed reading the same shards from one loopback SeaweedFS server, round after
round, interleaved with the server's limit (store_bench.py's probe over all the shards): GB/s,
the client's and the server's CPU seconds a GB, and the client's context switches, for each
build. Each build runs in a process of its own with its wheel's folder on ``PYTHONPATH``; its
``Loader`` is made before the timer, every byte is checked by the 64-bit word sum
(store_bench.py's pinfeed row), and the two builds take turns going first.

    pip install --target /tmp/site-old OLD.whl; pip install --target /tmp/site-new NEW.whl
    python3 bench/probes/store_ab.py /tmp/site-old /tmp/site-new [--rounds 6] [--out F]

A probe: prints a table, asserts nothing about speed.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import store_bench as sb  # noqa: E402  (bench/ holds the shared helpers)
from store_cpu_probe import server_cpu  # noqa: E402

CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[7])
import pinfeed, store_bench as sb
site = Path(os.environ["PYTHONPATH"]).resolve()
if site not in Path(pinfeed.__file__).resolve().parents:
    sys.exit(f"pinfeed came from {pinfeed.__file__}, not from {site}")
source, batch, passes, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
store = json.loads(sys.argv[5])
loader = pinfeed.Loader(source, batch, device="cpu", storage_options=store)
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
total = n = 0
for _ in range(passes):
    for b in loader:
        total = (total + sb.checksum(b)) % 2**64
        n += b.nbytes
wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
assert total == want, f"{sys.argv[6]}: pinfeed delivered other bytes"
cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
print(json.dumps(dict(build=pinfeed.__file__, gbps=n / wall / 1e9, bytes=n,
    client_cpu_s_per_gb=cpu / (n / 1e9), voluntary_switches=r1.ru_nvcsw - r0.ru_nvcsw,
    involuntary_switches=r1.ru_nivcsw - r0.ru_nivcsw)))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site_a", help="folder holding build A's pinfeed package")
    ap.add_argument("site_b", help="folder holding build B's pinfeed package")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mib", type=int, default=64)
    ap.add_argument("--batch-mib", type=float, default=4)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sites = dict(a=args.site_a, b=args.site_b)

    with sb.loopback_shards(args.shards, args.shard_mib) as shards:
        pid = shards.server.proc.pid
        want = shards.checksum * args.passes % 2**64
        source = f"s3://{shards.bucket}/bench/"
        store = json.dumps(sb.store_options(shards.endpoint))
        batch = sb.records_in(args.batch_mib)

        def run(build):
            argv = [source, batch, args.passes, want, store, build, HERE.parent]
            s0 = server_cpu(pid)
            out = subprocess.run(
                [sys.executable, "-c", CHILD, *map(str, argv)],
                env=dict(os.environ, PYTHONPATH=sites[build]),
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                last = (out.stderr.strip().splitlines() or ["no output"])[-1]
                raise SystemExit(f"store_ab: build {build} ({sites[build]}) failed: {last}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["server_cpu_s_per_gb"] = (server_cpu(pid) - s0) / (row["bytes"] / 1e9)
            return row

        rounds = []
        for i in range(args.rounds):
            limit = sb.server_limit(shards.endpoint, shards.bucket, shards.keys, shards.size)
            order = "ab" if i % 2 == 0 else "ba"
            rounds.append(dict(server_limit_gbps=limit, **{b: run(b) for b in order}))

    print(f"{'round':<7}{'limit':>7}{'A GB/s':>8}{'B GB/s':>8}{'B / A':>7}  client s/GB A, B")
    for i, r in enumerate(rounds):
        a, b = r["a"], r["b"]
        print(
            f"{i:<7}{r['server_limit_gbps']:>7.3f}{a['gbps']:>8.3f}{b['gbps']:>8.3f}"
            f"{b['gbps'] / a['gbps']:>7.2f}  {a['client_cpu_s_per_gb']:.2f}, "
            f"{b['client_cpu_s_per_gb']:.2f}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(dict(sites=sites, rounds=rounds), indent=1))


if __name__ == "__main__":
    main()
