"""One peer on one workload, in this process (`peers.py run` starts one of these per row):

    python3 bench/peers.py one --workload tokens --peer litdata --data DIR [...]

Prints the row as one JSON line, last: its measures, or `skipped` with the reason (the peer does
not import, or cannot do what the row asks), or `error`.
"""

import argparse
import faulthandler
import importlib
import json
import os
import time
import traceback

from lib.peers_measure import Skip, measure

MODULES = {
    "tokens": "lib.peers_tokens",
    "images": "lib.peers_images",
    "records": "lib.peers_records",
}


def parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=sorted(MODULES), required=True)
    p.add_argument("--peer", required=True)
    p.add_argument("--data", required=True, help="where the source and the conversions live")
    p.add_argument("--corpus", help="the uint16 token file (tokens)")
    p.add_argument("--records", help="the 3x31x31 uint8 .npy (records)")
    p.add_argument("--images", help="an ImageFolder of JPEGs (images)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, default=1024, help="window length (tokens)")
    p.add_argument("--order", default="random", choices=["random", "documents"])
    p.add_argument("--workers", type=int, default=8, help="a peer's worker processes/threads")
    p.add_argument("--batches", type=int, default=50, help="the least batches timed")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--min-seconds", type=float, default=3.0)
    p.add_argument("--model-steps", type=int, default=0, help="steps of the workload's model")
    p.add_argument(
        "--stacks-after",
        type=float,
        default=0,
        help="seconds after which every thread's stack goes to stderr (0: never)",
    )
    return p


def trainer_ready(device):
    """torch imported and its CUDA context up, as in a training script before its loader
    starts: the first batch's latency is then the loader's own, for every peer alike."""
    import torch

    if device.startswith("cuda"):
        torch.zeros(1, device=device)
        torch.cuda.synchronize()


def run(a):
    module = importlib.import_module(MODULES[a.workload])
    row = {"workload": a.workload, "peer": a.peer, "batch": a.batch}
    if a.workload == "tokens":
        row.update(seq=a.seq, order=a.order)
    try:
        trainer_ready(a.device)
        t0 = time.perf_counter()
        peer = module.PEERS[a.peer](a)
        row.update(version=peer.version, settings=peer.settings)
        row["setup_s"] = time.perf_counter() - t0
        row.update(measure(peer, a.device, a.batches, a.warmup, a.min_seconds))
        if a.model_steps:
            from lib.peers_models import step_time

            row.update(step_time(a, peer))
    except Skip as e:
        row["skipped"] = str(e)
    except ModuleNotFoundError as e:
        # The peer is not installed here; a changed API (a name gone from an installed package)
        # raises ImportError, an error.
        row["skipped"] = f"{e.name} does not import here ({e})"
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"
        row["traceback"] = traceback.format_exc(limit=-4)
    return row


def main():
    a = parser().parse_args()
    if a.stacks_after > 0:
        # A row that hangs says where: `peers.py run` kills it at its timeout, shortly after.
        faulthandler.dump_traceback_later(a.stacks_after, exit=False)
    row = run(a)
    print(json.dumps(row), flush=True)
    # Worker processes and pools of some peers outlive their loaders; the row is out.
    os._exit(0)


if __name__ == "__main__":
    main()
