"""The rows of `tokens.py text`, each run in a process of its own (`--one ROW`): packed windows
of 1024 tokens, 12 a batch, from the corpus's Parquet text to the device.

- `pinfeed`: `pinfeed.TokenLoader(folder, 1024, 12, column="text", tokenizer=..., eos_token=...,
  sample="sequential")`: tokenized on its threads; each step `(x, y, segment_ids, position_ids,
  cu_seqlens)`.
- `datasets map`: `load_dataset("parquet")`, `.map(tokenize, batched=True, num_proc=cores)` (the
  `tokenizers` package's `encode_batch`, EOS after each document), `.map(group_texts, ...)` into
  1025-token windows as run_clm's `group_texts` does (each map batch of 1,000 documents
  concatenated and cut, its remainder dropped), a DataLoader with workers whose `collate_fn`
  makes each batch one tensor (`pin_memory` on CUDA), `(x, y)` sliced on the device.
- `datasets streaming`: the same with `streaming=True` (an IterableDataset; the DataLoader's
  workers each take whole files).
- `pre-tokenized`: `pinfeed.TokenLoader` over the reference tokens as a uint16 `.bin`: the
  bound, no tokenizing.

A row times from the loader's making (the `datasets` rows' preprocessing included) to its last
batch on the device, or to `--row-seconds` after its first batch or `--row-tokens`: tokens (of
`x`) a second, CPU seconds of the process tree per million tokens (bench/lib/peers_measure.py's
`tree`: threads, workers alive and reaped), the first batch's latency, and tokens a second after
the first batch (a stream's rate without its start). Then it checks a sample of batches (the
first two and those numbered 10, 100, 1000, ...) against the reference: pinfeed's windows by
position (window v is tokens v * 1024 .. v * 1024 + 1024), with the position ids restarting at
0 at each window's start and after each EOS; the `datasets` windows, which stand where their map
batch put them, found whole in the reference.
"""

import os
import shutil
import tempfile
import time

import numpy as np

from lib.peers_measure import host_copy, sync, tree
from lib.peers_tokens import find

T, B = 1024, 12


def pinfeed_text(p, a):
    import pinfeed

    loader = pinfeed.TokenLoader(
        p["text_dir"],
        T,
        B,
        column="text",
        tokenizer=p["tokenizer"],
        eos_token=p["eos"],
        sample="sequential",
        device=a.device,
    )
    yield from loader


def pretokenized(p, a):
    import pinfeed

    loader = pinfeed.TokenLoader(
        p["reference"], T, B, token_dtype="uint16", sample="sequential", device=a.device
    )
    yield from loader


def _tokenize_fn(tokenizer, eos):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)

    def tokenize(batch):
        return {"input_ids": [e.ids + [eos] for e in tok.encode_batch(batch["text"])]}

    return tokenize


def group_texts(examples, block_size=T + 1):
    """run_clm's group_texts: a map batch's documents concatenated and cut into windows of
    `block_size` tokens, the remainder dropped."""
    from itertools import chain

    concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
    total_length = len(concatenated[list(examples.keys())[0]])
    total_length = (total_length // block_size) * block_size
    return {
        k: [t[i : i + block_size] for i in range(0, total_length, block_size)]
        for k, t in concatenated.items()
    }


def collate(examples):
    """A batch of windows as one int64 tensor, from the examples' Python lists: faster for a
    stream than `with_format("torch")`, which makes a tensor of each example on its own."""
    import torch

    return torch.tensor([e["input_ids"] for e in examples])


def _datasets(p, a, streaming):
    import datasets
    import torch

    cores = len(os.sched_getaffinity(0))
    files = p["paths"] if streaming else p["paths"][: a.map_files or None]
    cache = tempfile.mkdtemp(prefix="hf-", dir=a.dir)
    try:
        ds = datasets.load_dataset(
            "parquet", data_files=files, split="train", streaming=streaming, cache_dir=cache
        )
        multi = {} if streaming else {"num_proc": cores}
        tokenize = _tokenize_fn(p["tokenizer"], p["eos_id"])
        ds = ds.map(tokenize, batched=True, remove_columns=["text"], **multi)
        ds = ds.map(group_texts, batched=True, **multi)
        workers = min(a.workers, len(files)) if streaming else a.workers
        loader = torch.utils.data.DataLoader(
            ds,
            batch_size=B,
            num_workers=workers,
            collate_fn=collate,
            pin_memory=a.device.startswith("cuda"),
        )
        for batch in loader:
            yield batch.to(a.device, non_blocking=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def hf_map(p, a):
    return _datasets(p, a, streaming=False)


def hf_streaming(p, a):
    return _datasets(p, a, streaming=True)


def check_by_position(reference, k, batch, eos):
    """Batch k of sequential windows against the reference: x and y at their position, and for
    a text batch its position ids."""
    x, y = batch[0], batch[1]
    for r in range(len(x)):
        v = k * B + r
        w = reference[v * T : v * T + T + 1].astype(np.int64)
        if not (np.array_equal(x[r], w[:-1]) and np.array_equal(y[r], w[1:])):
            raise AssertionError(f"batch {k}, window {v}: not the reference's tokens")
        if len(batch) == 5:
            starts = np.zeros(T, dtype=bool)
            starts[0] = True
            starts[1:] = w[:-2] == eos
            first = np.maximum.accumulate(np.where(starts, np.arange(T), 0))
            if not np.array_equal(batch[3][r], np.arange(T) - first):
                raise AssertionError(f"batch {k}, window {v}: position ids do not restart at EOS")


def check_found(reference, k, batch):
    """A batch of (B, T + 1) windows from `datasets`: its first and last windows found whole
    in the reference."""
    for r in {0, len(batch) - 1}:
        if find(reference, batch[r].astype(np.uint16)) < 0:
            raise AssertionError(f"batch {k}, window {r}: not in the reference")


MAKERS = {
    "pinfeed": pinfeed_text,
    "datasets map": hf_map,
    "datasets streaming": hf_streaming,
    "pre-tokenized": pretokenized,
}


def _kept(i):
    """Whether batch i is one of those checked: 0, 1, 10, 100, 1000, ..."""
    return i < 2 or (i >= 10 and str(i).rstrip("0") == "1")


def _tokens(batch):
    x = batch[0] if isinstance(batch, tuple) else batch[:, :-1]
    return int(x.shape[0]) * int(x.shape[1])


def run(name, p, a):
    """Times row `name` and checks its kept batches; the row's measures."""
    # What the row imports is imported before it is timed.
    import torch  # noqa: F401

    import pinfeed  # noqa: F401

    if name.startswith("datasets"):
        import datasets  # noqa: F401

    cpu0, t0 = tree()[0], time.perf_counter()
    it = MAKERS[name](p, a)
    kept, tokens, i, stopped = {}, 0, 0, None
    for batch in it:
        if i == 0:
            sync(a.device)
            first_s = time.perf_counter() - t0
            first_tokens = _tokens(batch)
        if _kept(i):
            kept[i] = host_copy(batch)
        tokens += _tokens(batch)
        i += 1
        if a.row_tokens and tokens >= a.row_tokens:
            stopped = "tokens"
            break
        if a.row_seconds and time.perf_counter() - t0 - first_s >= a.row_seconds:
            stopped = "seconds"
            break
    if i == 0:
        raise RuntimeError("the loader delivered no batch")
    sync(a.device)
    seconds, cpu = time.perf_counter() - t0, tree()[0] - cpu0
    it.close()
    reference = np.memmap(p["reference"], dtype=np.uint16, mode="r")
    for k, b in kept.items():
        if name.startswith("datasets"):
            check_found(reference, k, b)
        else:
            check_by_position(reference, k, b, p["eos_id"])
    return {
        "tokens": tokens,
        "batches": i,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        # After the first batch: the rate of a stream without its start (None for one batch).
        "after_first_tokens_per_s": (tokens - first_tokens) / (seconds - first_s)
        if i > 1
        else None,
        "cpu_s_per_mtok": 1e6 * cpu / tokens,
        "first_batch_s": first_s,
        "stopped": stopped,
        "checked_batches": sorted(kept),
    }


def _gpt_run(a, batches):
    """ms a step of nanoGPT's GPT (bench/lib/nanogpt_model.py, tokens_nanogpt's configuration,
    bf16 autocast) over `a.train_steps` steps after `a.warmup`, fed by `batches`, and ms a step
    the trainer's thread spent in `next(batches)`."""
    import torch

    from lib.nanogpt_model import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(
        block_size=T, vocab_size=50304, n_layer=6, n_head=6, n_embd=384, dropout=0.0, bias=False
    )
    model = GPT(config).to("cuda")
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda")
    ctx = torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    X, Y = next(batches)
    waited = 0.0

    def step():
        nonlocal X, Y, waited
        with ctx:
            _, loss = model(X, Y)
        # As nanoGPT's train.py: the next batch is fetched while the GPU runs the forward pass.
        t = time.perf_counter()
        X, Y = next(batches)
        waited += time.perf_counter() - t
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    waited = 0.0
    t0 = time.perf_counter()
    for _ in range(a.train_steps):
        step()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0) / a.train_steps, 1000 * waited / a.train_steps


def _text_steps(p, a):
    """(x, y) of pinfeed's text loader over the first `--train-files` files, pass after pass."""
    import pinfeed

    loader = pinfeed.TokenLoader(
        p["train_dir"],
        T,
        B,
        column="text",
        tokenizer=p["tokenizer"],
        eos_token=p["eos"],
        sample="sequential",
        device="cuda",
    )
    while True:
        for step in loader:
            yield step[0], step[1]


def gpt(p, a):
    """The GPT step fed by pinfeed's text loader and by one resident batch (the bound), in
    `a.rounds` interleaved rounds; the median of each, and the loader's making (which
    tokenizes its files once to count their tokens)."""
    t0 = time.perf_counter()
    text = _text_steps(p, a)
    one = next(text)
    made_s = time.perf_counter() - t0
    runs = {"bound": [], "pinfeed": []}
    waits = {"bound": [], "pinfeed": []}
    for _ in range(a.rounds):
        for name, feed in (("bound", iter(lambda: one, None)), ("pinfeed", text)):
            ms, waited = _gpt_run(a, feed)
            runs[name].append(ms)
            waits[name].append(waited)
    median = {k: sorted(v)[len(v) // 2] for k, v in runs.items()}
    return {
        "ms_per_step": median,
        "runs": runs,
        "next_ms_per_step": {k: sorted(v)[len(v) // 2] for k, v in waits.items()},
        "overhead_vs_bound_pct": 100 * (median["pinfeed"] / median["bound"] - 1),
        "loader_made_s": made_s,
        "shape": [B, T],
        "steps": a.train_steps,
    }
