"""The noisy neighbour (issue 52 item 3): a launch-bound model (many small layers, a small batch,
so the CPU's kernel launches set its pace) fed by pinfeed's Loader, then by a batch already on
the GPU; pinfeed's share of the step time is the difference. CUDA only.

    python3 bench/peers.py noisy --records FILE.npy [--layers 200] [--batch 32] [--out F.json]

Each feed runs `--rounds` times, interleaved, each round in the reverse order of the last so
that no feed always runs first. The host moves a launch-bound step by several percent from run
to run, and slowly: a feed's share is its run against the resident run of the same round, the
median of those pairs and their range (and the medians of all runs, and the fastest, beside).
Each run also gives the process's CPU seconds a step (the trainer's thread and pinfeed's).
"""

import argparse
import json
import statistics
import time

import torch


def model(layers, width):
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods).cuda()


def run(feed, net, width, steps, warm):
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)

    def step():
        x = next(feed)
        x = x.reshape(len(x), -1)[:, :width].float() / 255
        net(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0) / steps, 1000 * (time.process_time() - c0) / steps


def pinfeed_feed(path, batch, threads):
    import pinfeed

    def gen():
        loader = pinfeed.Loader(path, batch, shuffle=True, device="cuda", num_threads=threads)
        while True:
            yield from loader

    return gen()


def share(step, base):
    """The percentage of `step` that a `base` step lacks (negative where `base` is slower)."""
    return 100 * (step - base) / step


def summarize(runs, cpu, base="resident"):
    """A row a feed from its runs (ms a step, round by round) and CPU ms a step: the median, the
    fastest, and the share of its step that `base`'s step lacks, by the rounds' pairs (each run
    against `base`'s of the same round: their median, and all of them sorted), by the medians
    and by the fastest runs."""
    med = {name: statistics.median(ms) for name, ms in runs.items()}
    rows = []
    for name, ms in runs.items():
        pairs = sorted(share(m, b) for m, b in zip(ms, runs[base]))
        rows.append(
            {
                "feed": name,
                "ms_per_step": med[name],
                "fastest_ms_per_step": min(ms),
                "runs": ms,
                "cpu_ms_per_step": statistics.median(cpu[name]),
                "cpu_runs": cpu[name],
                "pairs_pct": pairs,
                "share_by_pairs_pct": statistics.median(pairs),
                "share_of_step_pct": share(med[name], med[base]),
                "share_of_fastest_pct": share(min(ms), min(runs[base])),
            }
        )
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", required=True, help="the 3x31x31 uint8 .npy")
    p.add_argument("--layers", type=int, default=200)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=2, help="a second pinfeed row's reader threads")
    p.add_argument("--out")
    a = p.parse_args()
    torch.manual_seed(0)
    net = model(a.layers, a.width)
    resident = next(pinfeed_feed(a.records, a.batch, None)).clone()
    feeds = {
        "resident": lambda: iter(lambda: resident, None),
        "pinfeed": lambda: pinfeed_feed(a.records, a.batch, None),
        f"pinfeed threads={a.threads}": lambda: pinfeed_feed(a.records, a.batch, a.threads),
    }
    runs = {name: [] for name in feeds}
    cpu = {name: [] for name in feeds}
    for r in range(a.rounds):
        for name in list(feeds) if r % 2 == 0 else reversed(list(feeds)):
            ms, cpu_ms = run(feeds[name](), net, a.width, a.steps, 20)
            runs[name].append(ms)
            cpu[name].append(cpu_ms)
    rows = summarize(runs, cpu)
    for r in rows:
        print(
            f"{r['feed']:<22} median {r['ms_per_step']:7.3f} ms/step (runs "
            f"{min(r['runs']):.2f}-{max(r['runs']):.2f}), {r['cpu_ms_per_step']:.2f} CPU ms/step; "
            f"share by pairs {r['share_by_pairs_pct']:+.2f}% ({r['pairs_pct'][0]:+.1f} to "
            f"{r['pairs_pct'][-1]:+.1f}), of medians {r['share_of_step_pct']:+.2f}%, of the fastest "
            f"{r['share_of_fastest_pct']:+.2f}%"
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(
                {"args": vars(a), "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1
            )


if __name__ == "__main__":
    main()
