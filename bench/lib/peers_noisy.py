"""The noisy neighbour (issue 52 item 3): a launch-bound model (many small layers, a small batch,
so the CPU's kernel launches set its pace) fed by pinfeed's Loader, then by a batch already on
the GPU; pinfeed's share of the step time is the difference. CUDA only.

    python3 bench/peers.py noisy --records FILE.npy [--layers 200] [--batch 32] [--out F.json]

Each feed runs `--rounds` times, interleaved (resident, pinfeed, pinfeed with --threads, ...),
and the median of each is reported.
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
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0) / steps


def pinfeed_feed(path, batch, threads):
    import pinfeed

    def gen():
        loader = pinfeed.Loader(path, batch, shuffle=True, device="cuda", num_threads=threads)
        while True:
            yield from loader

    return gen()


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
    for _ in range(a.rounds):
        for name, make in feeds.items():
            runs[name].append(run(make(), net, a.width, a.steps, 20))
    # The host moves every feed's step by several percent from run to run: each row gives its
    # median and its fastest run, and pinfeed's share by both, with the runs' spread.
    base, best = statistics.median(runs["resident"]), min(runs["resident"])
    rows = []
    for name, ms in runs.items():
        med = statistics.median(ms)
        rows.append(
            {
                "feed": name,
                "ms_per_step": med,
                "fastest_ms_per_step": min(ms),
                "runs": ms,
                "share_of_step_pct": 100 * (med - base) / med,
                "share_of_fastest_pct": 100 * (min(ms) - best) / min(ms),
            }
        )
        r = rows[-1]
        print(
            f"{name:<22} median {med:7.3f} ms/step (runs {min(ms):.2f}-{max(ms):.2f})  "
            f"pinfeed's share {r['share_of_step_pct']:6.2f}% (fastest runs: "
            f"{r['share_of_fastest_pct']:.2f}%)"
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(
                {"args": vars(a), "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1
            )


if __name__ == "__main__":
    main()
