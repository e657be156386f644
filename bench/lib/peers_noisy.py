"""The noisy neighbour (issue 52 item 3): a launch-bound model (many small layers, a small batch,
so the CPU's kernel launches set its pace) fed by pinfeed's Loader, then by a batch already on
the GPU; pinfeed's share of the step time is the difference. CUDA only.

    python3 bench/peers.py noisy --records FILE.npy [--layers 200] [--batch 32] [--out F.json]

Every feed is made once and stays alive; the run is `--blocks` blocks of `--block-steps` steps
a feed, in turns, each block in the reverse order of the last so that no feed always runs
first. The host moves a launch-bound step by several percent, and slowly: a feed's share is
each of its blocks against the resident block beside it, the median of those pairs and their
range (and the medians of all blocks, and the fastest, beside). Each block also gives the
process's CPU ms a step (the trainer's thread and pinfeed's) and the trainer's ms a step inside
`next()`, the part of a step the feed takes on the trainer's own thread.
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


def stepper(net, width):
    """One training step of `net` on the next batch of a feed, and the ms it waited in `next()`."""
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)

    def step(feed):
        t = time.perf_counter()
        x = next(feed)
        waited = time.perf_counter() - t
        x = x.reshape(len(x), -1)[:, :width].float() / 255
        net(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return 1000 * waited

    return step


def block(step, feed, steps):
    """ms a step, CPU ms a step and ms a step in `next()`, over `steps` steps of `feed`."""
    torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    waited = sum(step(feed) for _ in range(steps))
    torch.cuda.synchronize()
    ms = 1000 * (time.perf_counter() - t0) / steps
    return ms, 1000 * (time.process_time() - c0) / steps, waited / steps


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


def summarize(runs, cpu, waits, base="resident"):
    """A row a feed from its blocks (ms a step, block by block), CPU ms a step and ms a step in
    `next()`: the median, the fastest, and the share of its step that `base`'s step lacks, by
    the blocks' pairs (each block against `base`'s of the same turn: their median, and all of
    them sorted), by the medians and by the fastest blocks."""
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
                "next_ms_per_step": statistics.median(waits[name]),
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
    p.add_argument("--block-steps", type=int, default=20, help="steps a block")
    p.add_argument("--blocks", type=int, default=30, help="blocks a feed, in turns")
    p.add_argument("--threads", type=int, default=2, help="a second pinfeed row's reader threads")
    p.add_argument("--out")
    a = p.parse_args()
    torch.manual_seed(0)
    net = model(a.layers, a.width)
    step = stepper(net, a.width)
    resident = next(pinfeed_feed(a.records, a.batch, None)).clone()
    feeds = {
        "resident": iter(lambda: resident, None),
        "pinfeed": pinfeed_feed(a.records, a.batch, None),
        f"pinfeed threads={a.threads}": pinfeed_feed(a.records, a.batch, a.threads),
    }
    for feed in feeds.values():
        block(step, feed, 20)
    runs, cpu, waits = ({name: [] for name in feeds} for _ in range(3))
    for b in range(a.blocks):
        for name in list(feeds) if b % 2 == 0 else reversed(list(feeds)):
            ms, cpu_ms, waited = block(step, feeds[name], a.block_steps)
            runs[name].append(ms)
            cpu[name].append(cpu_ms)
            waits[name].append(waited)
    rows = summarize(runs, cpu, waits)
    for r in rows:
        print(
            f"{r['feed']:<22} median {r['ms_per_step']:7.3f} ms/step (runs "
            f"{min(r['runs']):.2f}-{max(r['runs']):.2f}), {r['cpu_ms_per_step']:.2f} CPU ms/step, "
            f"{r['next_ms_per_step']:.3f} ms/step in next(); "
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
