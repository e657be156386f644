"""Turns the files one GPU run wrote under $OUT into the committed results and tables.

python3 bench/records.py report OUTDIR --date 2026-12-02 --tag h200

Writes bench/results/DATE-TAG/NAME.json (everything, raw) and NAME.png (a plot) beside it,
and prints the Markdown tables that docs/BENCHMARKS.md carries.
"""

import argparse
import json
import os
import statistics


def load(path):
    if not os.path.exists(path):
        return None
    if path.endswith(".jsonl"):
        return [json.loads(line) for line in open(path) if line.strip()]
    if path.endswith(".json"):
        return json.load(open(path))
    return open(path).read()


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--date", required=True)
    ap.add_argument("--tag", default="h200", help="the GPU (h100, h200) or devbox")
    ap.add_argument("--name", default="tables", help="the file's name in the run's folder")
    args = ap.parse_args()
    d = args.outdir
    raw = {
        "machine": load(f"{d}/machine.txt"),
        "gpu_tests": load(f"{d}/gpu_tests.txt"),
        "python_gpu_tests": load(f"{d}/python_gpu_tests.txt"),
        "pinfeed_bench": load(f"{d}/pinfeed_bench.json"),
        "pinfeed_stream": load(f"{d}/pinfeed_stream.jsonl"),
        "torch": load(f"{d}/torch.json"),
        # `records.py torch`'s printed table, kept when its JSON did not come back.
        "torch_console": load(f"{d}/torch_console.txt"),
        "python_bench": load(f"{d}/python_bench.json"),
        "doctor": load(f"{d}/doctor.json"),
        "torchrun_shards": load(f"{d}/torchrun_shards.json"),
        "big_machine": load(f"{d}/big_machine.txt"),
        "big_cached": load(f"{d}/big_cached.jsonl"),
        "big_dd": load(f"{d}/big_dd.txt"),
        "big_cold": load(f"{d}/big_cold.json"),
        "soak_log": load(f"{d}/soak.log"),
        "legacy_soak": load(f"{d}/legacy_soak.txt"),
        "multi": load(f"{d}/multi.jsonl"),
        "big_sweep": load(f"{d}/big_sweep.jsonl"),
        "copy_rates": load(f"{d}/copy_rates.txt"),
        "big_loader": load(f"{d}/big_loader.json"),
    }
    folder = f"bench/results/{args.date}-{args.tag}"
    os.makedirs(folder, exist_ok=True)
    base = f"{folder}/{args.name}"
    with open(base + ".json", "w") as f:
        json.dump(raw, f, indent=1)
    md = []
    torch_ = raw["torch"] or {}
    seed = {v["name"]: v for v in torch_.get("seed", {}).get("variants", [])}
    best = max(seed.values(), key=lambda v: v["gbps"]) if seed else None
    pinned_cap = max(
        (c["gbps"] for c in torch_.get("copy_rates", []) if c["source"] == "pinned"), default=None
    )
    if raw["pinfeed_bench"]:
        b = raw["pinfeed_bench"]
        rows = [
            [
                f"torch `{n}`",
                f"{v['wall_s'] * 1e3:.1f}",
                f"{v['cpu_s'] * 1e3:.0f}",
                f"{v['gbps']:.2f}",
                "",
            ]
            for n, v in seed.items()
        ]
        for v in b["variants"]:
            ratio = f"{v['gbps'] / best['gbps']:.2f}×" if best else ""
            rows.append(
                [
                    f"pinfeed bench `{v['name']}`",
                    f"{v['wall_s'] * 1e3:.1f}",
                    f"{v['cpu_s'] * 1e3:.0f}",
                    f"{v['gbps']:.2f}",
                    ratio,
                ]
            )
        md.append(
            f"### The seed experiment: {b['rows']} × {b['cols']} float32 ({b['bytes'] / 1e9:.2f} GB), one row per copy\n"
        )
        md.append(
            table(
                [
                    "variant",
                    "wall ms",
                    "CPU ms",
                    "GB/s",
                    f"vs torch's best ({best['name'] if best else '-'})",
                ],
                rows,
            )
        )
        if pinned_cap:
            md.append(
                f"\nPlain pinned copy rate measured in the same run (1 GiB `copy_`): {pinned_cap:.1f} GB/s."
            )
        md.append(
            f"\nPage-lock cost per row in (b): {b['page_lock_alloc_ms']:.3f} ms to allocate, {b['page_lock_free_ms']:.3f} ms to free; one row through the ring: {b['row_copy_ms']:.3f} ms."
        )
        for m in b.get("pin_methods", []):
            md.append(
                f"- page-locking {m['bytes'] >> 20} MiB with {m['method']}: {m['alloc_ms']:.1f} ms, freeing {m['free_ms']:.1f} ms"
            )
    if raw["copy_rates"]:
        md.append(
            "\nThe CPU's copy rate into pinned memory in the same run (`copy_rates`, best of three; the"
            " CPU-time floor of any staging copy):\n\n```\n" + raw["copy_rates"].strip() + "\n```"
        )
    if raw["pinfeed_stream"]:
        groups = {}
        for r in raw["pinfeed_stream"]:
            if r["crc32"] is not None:
                continue
            key = (r.get("shuffle", "none"), r.get("reader", "pread"), r["threads"])
            groups.setdefault(key, []).append(r)
        dl = torch_.get("dataloader", [])
        rows = [[f"DataLoader: {v['name']}", f"{v['gbps']:.2f}", "", ""] for v in dl]
        best_dl = max((v["gbps"] for v in dl), default=None)
        for (shuffle, reader, threads), rs in sorted(groups.items()):
            g = statistics.median(r["gbps"] for r in rs)
            cpu = statistics.median(r["cpu_seconds"] for r in rs)
            ratio = f"{g / best_dl:.1f}×" if best_dl else ""
            runs = f", median of {len(rs)}" if len(rs) > 1 else ""
            rows.append(
                [
                    f"`pinfeed stream --shuffle {shuffle}` ({reader}, {threads} thread(s){runs})",
                    f"{g:.2f}",
                    f"{cpu:.2f}",
                    ratio,
                ]
            )
        verified = [r for r in raw["pinfeed_stream"] if r["verified"]]
        md.append(
            "\n### 4 GiB page-cached `.npy` of `3,31,31` uint8 records to the GPU, batches of 1024\n"
        )
        md.append(table(["loader", "GB/s", "CPU s", "vs best DataLoader"], rows))
        for r in verified:
            md.append(
                f"\n`--verify --shuffle {r.get('shuffle', 'none')}` ({r.get('reader', 'pread')}): every batch read back from the GPU equals the file; CRC-32 of the delivered bytes {r['crc32']}."
            )
    pb = raw["python_bench"] or {}
    if pb.get("seed") and pb.get("loaders"):
        torch_best = next(
            (
                v
                for v in pb["seed"]["variants"]
                if v["name"] == "rows: i.pin_memory().cuda(non_blocking=True)"
            ),
            None,
        )

        def vs(v, k):
            return f"{v[k] / torch_best[k]:.2f}×" if torch_best and torch_best[k] else ""

        rows = [
            [
                v["name"],
                f"{v['wall_s'] * 1e3:.1f}",
                f"{v['cpu_s'] * 1e3:.0f}",
                f"{v['gbps']:.2f}",
                vs(v, "gbps"),
                vs(v, "cpu_s"),
            ]
            for v in pb["seed"]["variants"]
        ]
        md.append("\n### Python: the seed tensor\n")
        md.append(
            table(
                [
                    "variant",
                    "wall ms",
                    "CPU ms",
                    "GB/s",
                    "GB/s vs torch's best",
                    "CPU vs torch's best",
                ],
                rows,
            )
        )
        rows = [
            [
                v["name"],
                f"{v['wall_s'] * 1e3:.1f}",
                f"{v['cpu_s'] * 1e3:.0f}",
                f"{v['gbps']:.2f}",
                v["stats"]["bottleneck"]
                if "bottleneck" in v.get("stats", {}) and "fetch_s" in v["stats"]
                else "",
            ]
            for v in pb["loaders"]
        ]
        md.append("\n### Python: the 4 GiB file\n")
        md.append(
            table(
                [
                    "loader",
                    "wall ms",
                    "CPU ms",
                    "GB/s",
                    "prefetch's own account (`stats()['bottleneck']`)",
                ],
                rows,
            )
        )
    if isinstance(pb.get("batch_sizes"), list):
        whole = any("loader_whole_gbps" in r for r in pb["batch_sizes"])
        stream = any("stream_gbps" in r for r in pb["batch_sizes"])
        rows = [
            [
                f"{r['batch_mib']} MiB",
                f"{r['pinned_copy_gbps']:.2f}",
                f"{r['loader_gbps']:.2f}",
                f"{r['ratio']:.0%}",
            ]
            + ([f"{r['loader_whole_gbps']:.2f}"] if whole else [])
            + ([f"{r['stream_gbps']:.2f} ({r['stream_ratio']:.0%})"] if stream else [])
            for r in pb["batch_sizes"]
        ]
        md.append(
            "\n### Batch sizes: `pinfeed.Loader` over a 2 GiB host array against a plain pinned `copy_` of the same size\n"
        )
        md.append(
            table(
                ["batch", "pinned copy_ GB/s", "Loader GB/s", "ratio"]
                + (["Loader, whole-batch slots, GB/s"] if whole else [])
                + (
                    [
                        "`pinfeed stream` of the same bytes in a page-cached file, GB/s after start-up"
                    ]
                    if stream
                    else []
                ),
                rows,
            )
        )
    sw = pb.get("sweep")
    if isinstance(sw, dict) and sw.get("to_device"):
        rows = [
            [f"{r['arena_mib']} MiB", r["threads"], f"{r['gbps']:.2f}", f"{r['cpu_s'] * 1e3:.0f}"]
            for r in sw["to_device"]
        ]
        md.append(
            "\n### The staging arena's size: the seed tensor through `Stager` (two interleaved rounds)\n"
        )
        md.append(table(["arena", "copy threads", "GB/s", "CPU ms"], rows))
        rows = [
            [f"{r['batch_mib']} MiB", r["threads"], f"{r['gbps']:.2f}", r["bottleneck"]]
            for r in sw.get("loader", [])
        ]
        md.append("\n### Reader threads: `pinfeed.Loader` over a 2 GiB host array\n")
        md.append(table(["batch", "threads", "GB/s", "the loader's own account"], rows))
    if isinstance(pb.get("overlap"), dict) and "steps" in pb["overlap"]:
        o = pb["overlap"]
        md.append(
            f"\n### Overlap: {o['steps']} training steps of {o['gpu_step_ms']:.2f} ms GPU work on shuffled batches of {o['batch']} records\n"
        )
        md.append(
            table(
                ["data from", "wall s", "GPU idle"],
                [
                    ["already on the GPU (ideal)", f"{o['data_on_gpu_s']:.3f}", "0%"],
                    [
                        "pinfeed.Loader(shuffle=True)",
                        f"{o['pinfeed_s']:.3f}",
                        f"{o['pinfeed_gpu_idle']:.1%}",
                    ],
                    [
                        "DataLoader(pin_memory=True), whole-batch reads",
                        f"{o['dataloader_pin_memory_s']:.3f}",
                        f"{o['dataloader_gpu_idle']:.1%}",
                    ],
                ],
            )
        )
    if isinstance(pb.get("shuffled"), list):
        rows = [
            [v["name"], f"{v['wall_s'] * 1e3:.1f}", f"{v['cpu_s'] * 1e3:.0f}", f"{v['gbps']:.2f}"]
            for v in pb["shuffled"]
        ]
        md.append("\n### Shuffled records of the 4 GiB file\n")
        md.append(table(["loader", "wall ms", "CPU ms", "GB/s"], rows))
    caps = (pb.get("seed") or {}).get("caps") if isinstance(pb.get("seed"), dict) else None
    if caps:
        md.append("\n### What caps a pageable source on this machine (same run)\n")
        md.append(
            table(
                ["measured", "GB/s"],
                [
                    [
                        f"CPU memory copy of the seed tensor into another 2.68 GB tensor, DRAM to DRAM (torch `copy_`, {caps['torch_threads']} threads)",
                        f"{caps['memcpy_all_cores_gbps']:.2f}",
                    ],
                    [
                        "the same copy while the copy engine reads pinned memory",
                        f"{caps['memcpy_while_copy_engine_reads_gbps']:.2f}",
                    ],
                    [
                        "`cudaHostRegister` + `cudaHostUnregister` of touched pages, 32 MiB chunks",
                        f"{caps['register_unregister_gbps']:.2f}",
                    ],
                    ["plain pinned copy, 1 GiB", f"{caps['pinned_copy_1gib_gbps']:.2f}"],
                ],
            )
        )
        md.append(
            "\nA copy into a destination as large as the source writes every byte to DRAM; pinfeed's "
            "copies land in a pinned arena of 64 MiB that the CPU's cache holds, which is why "
            "`copy_rates` (in the seed table above) measures a higher CPU copy rate than this one. "
            "The arena's rate is the floor that bounds `to_device`.\n"
        )
    if raw["big_cached"] or raw["big_cold"]:
        rows = []
        for r in raw["big_cached"] or []:
            how = (
                f"auto`: {r['reader_auto_reason']}"
                if r.get("reader_auto_reason")
                else f"{r['reader_kind']}`"
            )
            rows.append(
                [
                    f"page-cached, batches of {r['batch_size']}, `--reader {how} ({r['reader']}, {r['threads']} threads)",
                    f"{r['gbps']:.2f}",
                    f"{r['streaming_gbps']:.2f}",
                    f"{r['cpu_seconds']:.1f}",
                    f"{r['peak_rss_bytes'] >> 20}",
                    f"{r['pinned_bytes_peak'] >> 20}",
                ]
            )
        c = raw["big_cold"]
        if c:
            rows.append(
                [
                    f"cold (caches dropped), batches of {c['batch_size']}, `--reader direct` ({c['reader']}, {c['threads']} threads)",
                    f"{c['gbps']:.3f}",
                    f"{c['streaming_gbps']:.3f}",
                    f"{c['cpu_seconds']:.1f}",
                    f"{c['peak_rss_bytes'] >> 20}",
                    f"{c['pinned_bytes_peak'] >> 20}",
                ]
            )
        r0 = (raw["big_cached"] or [raw["big_cold"]])[0]
        md.append(
            f"\n### A {r0['bytes'] / 1e9:.1f} GB `.npy` ({r0['records']} records of `3,31,31` uint8) to the GPU\n"
        )
        md.append(
            table(
                ["run", "GB/s", "GB/s after start-up", "CPU s", "peak RSS MiB", "pinned MiB"], rows
            )
        )
        if raw["big_dd"]:
            md.append(
                "\nThe disk's raw `O_DIRECT` rate in the same run (`dd bs=8M iflag=direct`):\n\n```\n"
                + raw["big_dd"].strip()
                + "\n```"
            )
    if raw["big_loader"]:
        rows = [
            [
                r["reader"],
                r["described"],
                r["threads"],
                r["pass"],
                f"{r['gbps']:.2f}",
                f"{r['cpu_s']:.1f}",
                r["explanation"],
            ]
            for r in raw["big_loader"]
        ]
        md.append(
            "\nThe same file through the Python `pinfeed.Loader` (batches of 1024), three passes with one Loader (the first checked against the file):\n"
        )
        md.append(
            table(
                [
                    "reader",
                    "as described",
                    "threads",
                    "pass",
                    "GB/s",
                    "CPU s",
                    "the Loader's account",
                ],
                rows,
            )
        )
    if raw["big_sweep"]:
        rows = [
            [
                r["threads"],
                r["slots"],
                f"{r['pinned_bytes_peak'] >> 20}",
                f"{r['streaming_gbps']:.2f}",
                r["explanation"],
            ]
            for r in raw["big_sweep"]
        ]
        md.append(
            "\n### The 40 GB file, page-cached: reader threads (batches of 1024, `--reader pread`)\n"
        )
        md.append(
            table(
                [
                    "threads",
                    "slots",
                    "pinned MiB",
                    "GB/s after start-up",
                    "the loader's own account",
                ],
                rows,
            )
        )
    if raw["multi"]:
        rows = []
        for r in raw["multi"]:
            per = ", ".join(f"{x['gbps']:.2f}" for x in r["devices"])
            rows.append(
                [
                    r["mode"],
                    len(r["devices"]),
                    f"{r['gbps']:.2f}",
                    f"{r['read_gbps']:.2f}",
                    per,
                    ", ".join(str(x.get("crc32")) for x in r["devices"])
                    if r.get("verified")
                    else "",
                ]
            )
        md.append(
            "\n### Several rings from one process (`pinfeed stream --devices cuda:0,cuda:0`): two rings on the one GPU\n"
        )
        md.append(
            table(
                [
                    "mode",
                    "devices",
                    "aggregate GB/s",
                    "read from the file GB/s",
                    "per device GB/s",
                    "CRC-32 per device (`--verify`)",
                ],
                rows,
            )
        )
    if raw["soak_log"]:
        last = [
            line
            for line in raw["soak_log"].splitlines()
            if line.startswith(("gpu soak:", "test result"))
        ]
        md.append("\n### GPU soak\n\n```\n" + "\n".join(last) + "\n```")
    print("\n".join(md))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names, rates = [], []
        for n, v in seed.items():
            names.append("torch " + n)
            rates.append(v["gbps"])
        if raw["pinfeed_bench"]:
            for v in raw["pinfeed_bench"]["variants"]:
                names.append("pinfeed " + v["name"])
                rates.append(v["gbps"])
        if names:
            fig, ax = plt.subplots(figsize=(9, 0.4 * len(names) + 1))
            ax.barh(
                names, rates, color=["#999" if n.startswith("torch") else "#2a7" for n in names]
            )
            if pinned_cap:
                ax.axvline(
                    pinned_cap,
                    color="k",
                    linestyle="--",
                    label=f"pinned copy {pinned_cap:.1f} GB/s",
                )
                ax.legend()
            ax.set_xlabel("GB/s to the GPU (seed experiment, same run)")
            fig.tight_layout()
            fig.savefig(base + ".png", dpi=100)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
