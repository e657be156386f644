"""pinfeed against its peers on its three workloads (issue 52), each peer in a process of its own,
in turns:

    python3 bench/peers.py run [--device cuda] [--data DIR] [--out peers.json] [--model-steps 50]

- tokens: a uint16 corpus (--tokens-gb), windows of 12x1024 and 64x4096 at random and 12x1024
  in document order: nanoGPT's get_batch, Megatron's GPTDataset, LitData, Mosaic, pinfeed;
- images: an ImageFolder of JPEGs (--images, made by `images.py make` when absent),
  RandomResizedCrop(224) + flip: DataLoader(ImageFolder), WebDataset, LitData, Mosaic,
  torchvision's GPU decode, SPDL, DALI, pinfeed (CPU and nvJPEG decode);
- records: the 3x31x31 uint8 .npy (--records): DataLoader, torchdata.nodes, LitData, Mosaic,
  pinfeed.

Each peer converts the data with its own writer once (DATA/peers/) and reads it with the settings
its row states. A row: samples/s to the device, CPU seconds of the process tree per 1,000
samples, its peak RSS, the first batch's latency, batches checked against the source, and with
--model-steps (CUDA only) the step time of the workload's model beside its bound. A peer that
cannot run says why (`skipped`). Writes every row to --out and prints a table.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from lib.peers_images import PEERS as IMAGE_PEERS
from lib.peers_records import PEERS as RECORD_PEERS
from lib.peers_records import make_records
from lib.peers_tokens import PEERS as TOKEN_PEERS
from lib.peers_tokens import make_corpus

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rows_to_run(a):
    """(workload, peer, extra arguments of `peers.py one`) of every row, in the order run."""
    todo = []
    want = a.peers.split(",") if a.peers else None
    for workload in a.workloads.split(","):
        peers = {"tokens": TOKEN_PEERS, "images": IMAGE_PEERS, "records": RECORD_PEERS}[workload]
        if workload == "tokens":
            shapes = [s.split("x") for s in a.shapes]
            configs = []
            if "random" in a.orders:
                configs += [["--batch", b, "--seq", t, "--order", "random"] for b, t in shapes]
            if "documents" in a.orders:
                b, t = shapes[0]
                configs.append(["--batch", b, "--seq", t, "--order", "documents"])
        elif workload == "images":
            configs = [["--batch", str(a.image_batch)]]
        else:
            configs = [["--batch", str(a.record_batch)]]
        for config in configs:
            # The peers asked for run in the order asked (a time limit may cut the last ones).
            for peer in want or peers:
                if peer in peers:
                    todo.append((workload, peer, config))
    return todo


def prepare(a):
    os.makedirs(a.data, exist_ok=True)
    workloads = a.workloads.split(",")
    if "tokens" in workloads:
        make_corpus(a.corpus, int(a.tokens_gb * 2**30))
    if "records" in workloads:
        make_records(a.records, a.record_count)
    if "images" in workloads and not os.path.isdir(a.images):
        subprocess.run(
            [
                sys.executable,
                os.path.join(BENCH, "images.py"),
                "make",
                os.path.dirname(a.images),
                "--count",
                str(a.images_count),
                "--no-tar",
            ],
            check=True,
        )


def one(a, workload, peer, config):
    cmd = [
        sys.executable,
        os.path.join(BENCH, "peers.py"),
        "one",
        "--workload",
        workload,
        "--peer",
        peer,
        "--data",
        a.data,
        "--corpus",
        a.corpus,
        "--records",
        a.records,
        "--images",
        a.images,
        "--device",
        a.device,
        "--workers",
        str(a.workers),
        "--batches",
        str(a.batches),
        "--warmup",
        str(a.warmup),
        "--min-seconds",
        str(a.min_seconds),
        "--model-steps",
        str(a.model_steps),
        "--stacks-after",
        str(max(1, a.timeout - 5)),
        *config,
    ]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired as e:
        row = {"workload": workload, "peer": peer, "error": f"no row within {a.timeout} s"}
        row["stacks"] = stacks(e.stderr)
        return row
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"workload": workload, "peer": peer, "error": f"exit {p.returncode}: {tail}"}
    row = json.loads(lines[-1])
    row["process_s"] = time.perf_counter() - t0
    return row


def stacks(stderr):
    """Where a timed-out row's process was, from the stacks `peers.py one --stacks-after`
    wrote: the main thread's innermost frames, and each other thread's innermost one."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or ""
    if "Timeout (" not in text:
        return {}
    threads = []
    for block in text.split("Timeout (")[-1].split("\n\n"):
        frames = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("File ")]
        if frames:
            threads.append(frames)
    main = [t for t in threads if t[-1].endswith("in <module>")]
    return {
        "main": main[0][:6] if main else [],
        "others": [t[0] for t in threads if not main or t is not main[0]][:16],
    }


def label(row):
    if row["workload"] == "tokens" and "seq" in row:
        return f"tokens {row['batch']}x{row['seq']} {row['order']}"
    return f"{row['workload']} b{row.get('batch', '?')}"


def table(rows):
    print(
        f"\n{'rows':<28} {'peer':<16} {'samples/s':>11} {'CPU s/1k':>9} {'RSS MiB':>8} "
        f"{'1st s':>6} {'ok':>3} {'ms/step':>8} {'bound':>7}"
    )
    for r in rows:
        head = f"{label(r):<28} {r['peer']:<16}"
        if "samples_per_s" in r:
            print(
                f"{head} {r['samples_per_s']:>11.0f} {r['cpu_s_per_1k']:>9.3f} "
                f"{r['peak_rss_mib']:>8.0f} {r['first_batch_s']:>6.2f} "
                f"{r['checked_batches']:>3} {r.get('model_ms_per_step', float('nan')):>8.2f} "
                f"{r.get('bound_ms_per_step', float('nan')):>7.2f}"
            )
        else:
            print(f"{head} {'skipped: ' + r['skipped'] if 'skipped' in r else r.get('error')}")


def parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda, or cpu for the host backend (CI)")
    p.add_argument("--data", default="/tmp/pinfeed-peers")
    p.add_argument("--workloads", default="tokens,images,records")
    p.add_argument("--peers", help="only these peers (comma-separated names), in this order")
    p.add_argument("--tokens-gb", type=float, default=2.0)
    p.add_argument("--shapes", default="12x1024,64x4096", type=lambda s: s.split(","))
    p.add_argument(
        "--orders",
        default="random,documents",
        type=lambda s: s.split(","),
        help="token windows at random (each shape) and in document order (the first shape)",
    )
    p.add_argument("--corpus", help="the uint16 corpus (default DATA/tokens/train.bin)")
    p.add_argument("--records", help="the records .npy (default DATA/records.npy; made if absent)")
    p.add_argument("--record-count", type=int, default=1489700, help="4 GiB of 3x31x31 uint8")
    p.add_argument("--record-batch", type=int, default=1024)
    p.add_argument("--images", help="an ImageFolder (default DATA/images/train; made if absent)")
    p.add_argument("--images-count", type=int, default=20000)
    p.add_argument("--image-batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--min-seconds", type=float, default=5.0)
    p.add_argument("--model-steps", type=int, default=0, help="model steps a row (CUDA only)")
    p.add_argument("--rounds", type=int, default=1, help="runs of every row, in turns")
    p.add_argument("--timeout", type=int, default=900, help="seconds a row may take")
    p.add_argument("--out")
    return p


def main():
    a = parser().parse_args()
    a.corpus = a.corpus or os.path.join(a.data, "tokens", "train.bin")
    a.records = a.records or os.path.join(a.data, "records.npy")
    a.images = a.images or os.path.join(a.data, "images", "train")
    prepare(a)
    rows = []
    for rnd in range(a.rounds):
        for workload, peer, config in rows_to_run(a):
            row = one(a, workload, peer, config)
            row["round"] = rnd
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
            if a.out:  # every row so far, should a later one not finish
                with open(a.out, "w") as f:
                    json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    table(rows)


if __name__ == "__main__":
    main()
