"""The tokens workload's peers: (x, y) int64 batches of B windows of T tokens from one uint16
corpus, in random windows (`random`) or in the corpus's order (`documents`).

Each peer reads the corpus as its own writer converted it (once, into DATA/peers/NAME-*):
nanoGPT's get_batch and pinfeed's TokenLoader read the raw file; Megatron reads an indexed
dataset written by its IndexedDatasetBuilder (documents of 8,192 tokens); LitData reads chunks
written by `optimize` with its TokensLoader; Mosaic reads MDS shards of T+1-token samples (it can
only return whole samples, so its random windows are a shuffle of fixed windows, as LitData's
and Megatron's are). A window is checked against the corpus: it must occur there (found by
search, since no peer hands out offsets; Megatron's and LitData's as runs that break only at
their writer's document or item bounds, as they join these in their own order), with its
targets shifted by one, and a batch in document order must be consecutive windows.
"""

import os
import sys

import numpy as np

from lib.peers_measure import Peer, Skip, converted, mark_converted

VOCAB = 50257
# The writers' pieces (tokens): Megatron's documents, LitData's items (optimize's inputs).
MEGATRON_DOC = 8192
LITDATA_ITEM = 1 << 22


def make_corpus(path, size_bytes):
    """Random uint16 tokens below VOCAB, written once (nanoGPT's train.bin)."""
    from lib.tokens_nanogpt import make_train_bin

    make_train_bin(path, size_bytes // 2 * 2, VOCAB)


def find(corpus, window, chunk=1 << 26):
    """The first offset of `window` in `corpus`, or -1."""
    n = len(window)
    for start in range(0, len(corpus) - n + 1, chunk):
        part = corpus[start : min(len(corpus), start + chunk + n)]
        cand = np.flatnonzero(part[: len(part) - n + 1] == window[0])
        for k in range(1, min(n, 4)):
            cand = cand[part[cand + k] == window[k]]
        for c in cand:
            if np.array_equal(part[c : c + n], window):
                return start + int(c)
    return -1


def runs_in(corpus, window, piece):
    """The corpus offset where `window` starts, or -1. Without `piece`, the window is one run of
    the corpus. With `piece` (a peer that joins its writer's pieces of `piece` tokens in its own
    order: Megatron's documents, LitData's items), it is runs that break only at piece bounds: a
    run to the end of a piece, whole pieces, then a run from a piece's start. A run may be a
    single token (a window that ends one token into a document, or a LitData block that starts
    4 tokens before an item's end), so runs are matched at the bounds, not by a search key."""
    if piece is None:
        return find(corpus, window)
    starts = np.arange(0, len(corpus), piece)
    ends = np.minimum(starts + piece, len(corpus))
    heads = np.asarray(corpus[starts])

    def from_starts(rest):
        # `rest` as pieces read from their starts: whole ones, then the head of one.
        while len(rest):
            for s, e in zip(starts[heads == rest[0]], ends[heads == rest[0]]):
                n = min(len(rest), int(e - s))
                if np.array_equal(corpus[s : s + n], rest[:n]):
                    break
            else:
                return False
            rest = rest[n:]
        return True

    at = find(corpus, window[: min(len(window), 8)])
    if at >= 0:
        n = min(len(window), int(ends[at // piece]) - at)
        ok = np.array_equal(corpus[at : at + n], window[:n]) and from_starts(window[n:])
        return at if ok else -1
    # A first run shorter than 8 tokens: the last n tokens of a piece.
    for n in range(1, min(8, len(window))):
        tail = ends - n >= starts
        for j in range(n):
            tail &= corpus[np.maximum(ends - n + j, 0)] == window[j]
        if tail.any() and from_starts(window[n:]):
            return int(ends[np.argmax(tail)]) - n
    return -1


def checker(corpus_path, order, windows=3, piece=None):
    """A check of a host (x, y) batch: targets shifted by one, the first `windows` windows found
    in the corpus (as runs broken only at the bounds of its writer's pieces of `piece` tokens,
    for a peer that joins them in its own order), and, in document order, each at a constant
    stride from the one before."""

    def check(batch):
        x, y = batch[0], batch[1]
        if x.dtype != np.int64 or x.shape != y.shape:
            raise AssertionError(f"x {x.dtype} {x.shape}, y {y.dtype} {y.shape}")
        if not np.array_equal(x[:, 1:], y[:, :-1]):
            raise AssertionError("y is not x shifted by one")
        corpus = np.memmap(corpus_path, dtype=np.uint16, mode="r")
        at = []
        for row in range(min(windows, len(x))):
            w = np.concatenate([x[row], y[row, -1:]]).astype(np.uint16)
            p = runs_in(corpus, w, piece)
            if p < 0:
                raise AssertionError(f"window {row} of the batch is not in the corpus")
            at.append(p)
        # In document order each window starts where the one before ends: T tokens on (the
        # windows share a token, pinfeed's) or T + 1 (fixed samples, LitData's and Mosaic's);
        # a peer that reorders its writer's pieces keeps that stride only within a piece.
        t = x.shape[1]
        pairs = [(a, b) for a, b in zip(at, at[1:]) if piece is None or a // piece == b // piece]
        strides = {b - a for a, b in pairs}
        consecutive = len(strides) <= 1 and strides <= {t, t + 1}
        if order == "documents" and not consecutive:
            raise AssertionError(f"windows at {at} are not consecutive")

    return check


def split_xy(device):
    """Delivers a (B, T + 1) token batch as int64 (x, y) on the device, as litgpt does."""
    from lib.peers_measure import to_device

    def deliver(batch, dev=device):
        b = to_device(batch, dev)
        if isinstance(b, dict):
            b = b["tokens"]
        b = b.long()
        return b[:, :-1], b[:, 1:]

    return deliver


def nanogpt(a):
    import torch

    import lib.tokens_nanogpt as ng

    if a.order != "random":
        raise Skip("get_batch draws random windows only")
    if os.path.basename(a.corpus) != "train.bin":
        raise Skip("get_batch reads DIR/train.bin: name the corpus so")
    ng.device, ng.device_type = a.device, "cuda" if a.device.startswith("cuda") else "cpu"
    return Peer(
        lambda: ng.get_batch_stream(a.corpus, a.batch, a.seq),
        a.batch,
        checker(a.corpus, a.order),
        {"note": "np.memmap each batch, torch.randint offsets, pin_memory + non_blocking"},
        f"nanoGPT 3adf61e, torch {torch.__version__}",
    )


def pinfeed_peer(a):
    import inspect

    import pinfeed

    params = inspect.signature(pinfeed.TokenLoader).parameters
    width = {"token_dtype": "uint16"} if "token_dtype" in params else {"dtype": "uint16"}
    sample = "random" if a.order == "random" else "sequential"

    def batches():
        loader = pinfeed.TokenLoader(
            a.corpus, a.seq, a.batch, sample=sample, seed=0, device=a.device, **width
        )
        while True:
            yield from loader

    return Peer(
        batches,
        a.batch,
        checker(a.corpus, a.order),
        {"sample": sample, "num_threads": "pinfeed's own", "prefetch": 4},
        pinfeed.__version__,
    )


def _pieces(corpus_path, size):
    n = os.path.getsize(corpus_path) // 2
    return [(s, min(n, s + size)) for s in range(0, n, size)]


def _litdata_piece(item):
    import torch

    path, start, end = item
    tokens = np.memmap(path, dtype=np.uint16, mode="r")[start:end]
    # litdata's TokensLoader stores one dtype; int32 is litgpt's, and uint16 is not torch's.
    yield torch.from_numpy(tokens.astype(np.int32))


def litdata_peer(a):
    import litdata
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    out = os.path.join(a.data, "peers", "litdata-tokens")
    if not converted(out):
        litdata.optimize(
            fn=_litdata_piece,
            inputs=[(a.corpus, s, e) for s, e in _pieces(a.corpus, LITDATA_ITEM)],
            output_dir=out,
            chunk_bytes="64MB",
            item_loader=TokensLoader(),
            num_workers=a.workers,
            verbose=False,
        )
        mark_converted(out)

    def batches():
        ds = StreamingDataset(
            out,
            item_loader=TokensLoader(block_size=a.seq + 1),
            shuffle=a.order == "random",
            drop_last=True,
        )
        while True:
            yield from StreamingDataLoader(
                ds, batch_size=a.batch, num_workers=a.workers, pin_memory=True, drop_last=True
            )

    return Peer(
        batches,
        a.batch,
        checker(a.corpus, a.order, piece=LITDATA_ITEM),
        {
            "writer": "optimize(TokensLoader(), chunk_bytes=64MB, int32 tokens)",
            "reader": "StreamingDataset(TokensLoader(block_size=T+1)) + StreamingDataLoader",
            "num_workers": a.workers,
            "pin_memory": True,
        },
        f"litdata {litdata.__version__}",
        split_xy(a.device),
    )


def mosaic_peer(a):
    import streaming
    import torch
    from streaming import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    t1 = a.seq + 1
    out = os.path.join(a.data, "peers", f"mosaic-tokens-{t1}")
    if not converted(out):
        corpus = np.memmap(a.corpus, dtype=np.uint16, mode="r")
        with MDSWriter(out=out, columns={"tokens": f"ndarray:uint16:{t1}"}) as w:
            for s in range(0, len(corpus) - t1 + 1, t1):
                w.write({"tokens": np.asarray(corpus[s : s + t1])})
        mark_converted(out)

    class Tokens(StreamingDataset):
        # llm-foundry's StreamingTextDataset: each sample's tokens as int64 in the worker.
        def __getitem__(self, i):
            return torch.from_numpy(super().__getitem__(i)["tokens"].astype(np.int64))

    def batches():
        ds = Tokens(local=out, batch_size=a.batch, shuffle=a.order == "random", shuffle_seed=0)
        while True:
            yield from torch.utils.data.DataLoader(
                ds,
                batch_size=a.batch,
                num_workers=a.workers,
                pin_memory=True,
                drop_last=True,
                persistent_workers=False,
            )

    return Peer(
        batches,
        a.batch,
        checker(a.corpus, a.order),
        {
            "writer": f"MDSWriter(ndarray:uint16:{t1}), default 64 MiB shards, no compression",
            "reader": "StreamingDataset(shuffle py1e) + DataLoader, int64 in the worker",
            "num_workers": a.workers,
            "pin_memory": True,
        },
        f"mosaicml-streaming {streaming.__version__}",
        split_xy(a.device),
    )


def megatron_peer(a):
    try:
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
        from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer
    except Exception as e:
        raise Skip(f"megatron-core does not import here ({type(e).__name__}: {e})") from None
    import megatron.core
    import torch

    if a.order != "random":
        raise Skip("GPTDataset always shuffles its samples (its shuffle index)")
    prefix = os.path.join(a.data, "peers", "megatron-tokens", "corpus")
    if not converted(os.path.dirname(prefix)):
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        corpus = np.memmap(a.corpus, dtype=np.uint16, mode="r")
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
        for s, e in _pieces(a.corpus, MEGATRON_DOC):
            builder.add_document(torch.from_numpy(np.asarray(corpus[s:e])), [e - s])
        builder.finalize(prefix + ".idx")
        mark_converted(os.path.dirname(prefix))
    config = GPTDatasetConfig(
        random_seed=0,
        sequence_length=a.seq,
        blend=([prefix], None),
        split="1,0,0",
        path_to_cache=os.path.dirname(prefix),
        tokenizer=NullTokenizer(vocab_size=65536),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
    )
    samples = os.path.getsize(a.corpus) // 2 // (a.seq + 1)
    ds = BlendedMegatronDatasetBuilder(GPTDataset, [samples, None, None], lambda: True, config)
    train = ds.build()[0]

    def deliver(batch, dev=a.device):
        from lib.peers_measure import to_device

        b = to_device(batch, dev)
        return b["tokens"], b["labels"]

    def batches():
        while True:
            yield from torch.utils.data.DataLoader(
                train,
                batch_size=a.batch,
                num_workers=a.workers,
                pin_memory=True,
                drop_last=True,
                persistent_workers=False,
            )

    return Peer(
        batches,
        a.batch,
        checker(a.corpus, a.order, piece=MEGATRON_DOC),
        {
            "writer": f"IndexedDatasetBuilder, documents of {MEGATRON_DOC} tokens",
            "reader": "GPTDataset (BlendedMegatronDatasetBuilder) + DataLoader",
            "num_workers": a.workers,
            "pin_memory": True,
        },
        f"megatron-core {getattr(megatron.core, '__version__', '?')}",
        deliver,
    )


PEERS = {
    "nanogpt": nanogpt,
    "megatron": megatron_peer,
    "litdata": litdata_peer,
    "mosaic": mosaic_peer,
    "pinfeed": pinfeed_peer,
}

if __name__ == "__main__":
    sys.exit("run through bench/peers.py")
