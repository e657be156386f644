"""Parquet records to the device (issue 50): `pinfeed.Loader(parquet, columns=[...])` against
`pinfeed.Loader(npy)` over the same bytes.

    python3 bench/records.py parquet [--size-gb 2] [--columns 32] [--out parquet.json]

Writes, once into `--dir`, `--size-gb` of float32 records of `--columns` columns (standard
normal values, seed 0) as one Parquet file (one column each, row groups of `--row-group-mb`,
`--compression`) and as a `(rows, columns)` float32 `.npy` of the same bytes; reads both once
(page cache). Then, `--rounds` times in turn, each row makes `--passes` fresh loaders and takes
one pass of each to the device in `--batch`-record batches, in file order: GB/s of record bytes
(from the loader's making to its last batch on the device) and CPU seconds a GB (this process:
every pinfeed thread). A fresh loader a pass, because the decoded row groups a Parquet loader
keeps (1 GiB at most) would serve a second pass of a smaller file without decoding it. Before
timing, each row's first batches and those numbered 10, 100, 1000, ... are checked against
pyarrow's read of the file. Each row's median is reported, and Parquet's share of `.npy`'s
rate. Target (issue 50): Parquet within 80% of `.npy`.
"""

import argparse
import json
import os
import time

import numpy as np


def write(folder, size_gb, columns, row_group_mb, compression):
    """The Parquet file and the `.npy` of the same records, written unless their manifest
    matches; (parquet path, npy path, rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    parquet, npy = os.path.join(folder, "records.parquet"), os.path.join(folder, "records.npy")
    manifest = os.path.join(folder, "manifest.json")
    rows = int(size_gb * 1e9) // (4 * columns)
    want = {"rows": rows, "columns": columns, "row_group_mb": row_group_mb, "c": compression}
    if os.path.exists(manifest):
        with open(manifest) as f:
            if json.load(f) == want:
                return parquet, npy, rows
    group = max(1, (row_group_mb << 20) // (4 * columns))
    names = [f"c{j:02d}" for j in range(columns)]
    out = np.lib.format.open_memmap(npy, mode="w+", dtype=np.float32, shape=(rows, columns))
    rng = np.random.default_rng(0)
    schema = pa.schema([(n, pa.float32()) for n in names])
    with pq.ParquetWriter(parquet, schema, compression=compression) as w:
        for start in range(0, rows, group):
            block = rng.standard_normal((min(group, rows - start), columns), dtype=np.float32)
            out[start : start + len(block)] = block
            table = pa.table({n: block[:, j] for j, n in enumerate(names)}, schema=schema)
            w.write_table(table, row_group_size=len(block))
    out.flush()
    del out
    with open(manifest, "w") as f:
        json.dump(want, f)
    return parquet, npy, rows


def read_once(path):
    with open(path, "rb") as f:
        while f.read(1 << 26):
            pass


def sync(device):
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def host(batch):
    """A delivered batch on the host, as numpy: (rows, columns) float32."""
    if isinstance(batch, dict):
        return np.stack([host(v) for v in batch.values()], axis=1)
    if not isinstance(batch, np.ndarray):
        batch = batch.cpu().numpy()
    return np.array(batch)


def make(kind, parquet, npy, a):
    import pinfeed

    if kind == "parquet":
        names = [f"c{j:02d}" for j in range(a.columns)]
        return pinfeed.Loader(parquet, a.batch, columns=names, device=a.device)
    return pinfeed.Loader(npy, a.batch, device=a.device)


def check(kind, parquet, npy, a, table):
    """The first batches of a pass, and those numbered 10, 100, ..., equal pyarrow's read
    (`table`)."""
    checked = []
    for k, batch in enumerate(make(kind, parquet, npy, a)):
        if k < 2 or (k >= 10 and str(k).rstrip("0") == "1"):
            part = table.slice(k * a.batch, a.batch)
            want = np.stack([c.to_numpy() for c in part.columns], axis=1)
            if not np.array_equal(host(batch), want):
                raise AssertionError(f"{kind}: batch {k} is not pyarrow's records")
            checked.append(k)
    return checked


def timed(kind, parquet, npy, a, nbytes):
    """GB/s and CPU seconds a GB of `a.passes` passes, each by a fresh loader."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(a.passes):
        for _batch in make(kind, parquet, npy, a):
            pass
        sync(a.device)
    seconds, cpu = time.perf_counter() - w0, time.process_time() - c0
    gb = a.passes * nbytes / 1e9
    return {"gbps": gb / seconds, "cpu_s_per_gb": cpu / gb, "seconds": seconds}


def run(a):
    import pyarrow.parquet as pq

    parquet, npy, rows = write(a.dir, a.size_gb, a.columns, a.row_group_mb, a.compression)
    read_once(parquet)
    read_once(npy)
    table = pq.read_table(parquet)
    nbytes = rows * a.columns * 4
    result = {"rows": rows, "record_bytes": 4 * a.columns, "bytes": nbytes}
    result["parquet_file_bytes"] = os.path.getsize(parquet)
    result["checked"] = {k: check(k, parquet, npy, a, table) for k in ("parquet", "npy")}
    del table
    runs = {"parquet": [], "npy": []}
    for r in range(a.rounds):
        for kind in runs:
            runs[kind].append(dict(timed(kind, parquet, npy, a, nbytes), round=r + 1))
            print(kind, runs[kind][-1], flush=True)
    median = {k: sorted(v, key=lambda x: x["gbps"])[len(v) // 2] for k, v in runs.items()}
    share = median["parquet"]["gbps"] / median["npy"]["gbps"]
    result.update(runs=runs, median=median, parquet_share_of_npy=share)
    met = "met" if share >= 0.8 else "missed"
    result["target"] = f"Parquet within 80% of .npy: {share:.0%}: {met}"
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp/pinfeed_parquet", help="the cache folder")
    p.add_argument("--size-gb", type=float, default=2.0, help="record bytes (1e9)")
    p.add_argument("--columns", type=int, default=32, help="float32 columns a record")
    p.add_argument("--row-group-mb", type=int, default=128)
    p.add_argument("--compression", default="snappy", help="Parquet's codec (none, snappy, ...)")
    p.add_argument("--batch", type=int, default=16384, help="records a batch")
    p.add_argument("--passes", type=int, default=3, help="passes a row a round, fresh loaders")
    p.add_argument("--rounds", type=int, default=3, help="rounds of both rows, in turn")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda where present)")
    p.add_argument("--out", help="where to write the JSON results")
    a = p.parse_args()
    if a.device is None:
        from lib.tokens_mixture import default_device

        a.device = default_device()
    result = run(a)
    m = result["median"]
    print(f"\n{'source':<10} {'GB/s':>8} {'CPU s/GB':>9}  (median of {a.rounds} rounds)")
    for kind in ("parquet", "npy"):
        print(f"{kind:<10} {m[kind]['gbps']:>8.2f} {m[kind]['cpu_s_per_gb']:>9.2f}")
    print(f"checked batches: {result['checked']}")
    print(f"target: {result['target']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(result, args=vars(a)), f, indent=1)


if __name__ == "__main__":
    main()
