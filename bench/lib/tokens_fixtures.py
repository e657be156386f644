"""Small Megatron indexed datasets written by megatron-core's own builder, for pinfeed's tests.

    python3 bench/tokens.py fixtures OUTDIR [--site DIR]

Needs torch and numpy (the GPU machine has both) and megatron-core: installed, or unpacked
into DIR and named with --site (megatron-core is a cp312 wheel; `pip install --no-deps --target
DIR megatron_core-*.whl` needs no network). For each variant NAME it writes, into OUTDIR:

- NAME.bin, NAME.idx: written by `IndexedDatasetBuilder`;
- NAME_tokens.npy: every token of the .bin in order, int64;
- NAME_document_lengths.npy: tokens in each document, int64;
- NAME_sequence_lengths.npy, NAME_sequence_pointers.npy, NAME_document_indices.npy: the index
  as megatron-core's own reader (`IndexedDataset`) reads it back, int64.

The Rust tests (crates/source/src/tokens/megatron.rs) read these files when they exist.
"""

import argparse
import os
import sys

import numpy as np


def documents(rng, vocab):
    """Documents as lists of sequences: lengths chosen to include a one-token document, an
    empty sequence and a document of several sequences."""
    lengths = [[7], [1], [3, 0, 5], [12], [2, 2], [30], [4]]
    return [[rng.integers(0, vocab, n, dtype=np.int64) for n in doc] for doc in lengths]


def build(outdir, name, dtype, vocab, seed):
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    prefix = os.path.join(outdir, name)
    docs = documents(np.random.default_rng(seed), vocab)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for k, doc in enumerate(docs):
        if k % 2 == 0:
            # One call per document.
            builder.add_document(torch.from_numpy(np.concatenate(doc)), [len(s) for s in doc])
        else:
            # One call per sequence, then the document's end.
            for seq in doc:
                builder.add_item(torch.from_numpy(seq))
            builder.end_document()
    builder.finalize(prefix + ".idx")

    tokens = np.concatenate([np.concatenate(doc) for doc in docs]).astype(np.int64)
    np.save(prefix + "_tokens.npy", tokens)
    np.save(
        prefix + "_document_lengths.npy",
        np.array([sum(len(s) for s in doc) for doc in docs], dtype=np.int64),
    )
    dataset = IndexedDataset(prefix)
    index = dataset.index
    np.save(prefix + "_sequence_lengths.npy", np.asarray(index.sequence_lengths, np.int64))
    np.save(prefix + "_sequence_pointers.npy", np.asarray(index.sequence_pointers, np.int64))
    np.save(prefix + "_document_indices.npy", np.asarray(index.document_indices, np.int64))
    # megatron-core's reader agrees with what was written.
    assert np.array_equal(np.fromfile(prefix + ".bin", dtype=dtype).astype(np.int64), tokens)
    print(f"{prefix}: {len(docs)} documents, {len(tokens)} {np.dtype(dtype).name} tokens")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--site", help="a folder holding the megatron package")
    args = parser.parse_args()
    if args.site:
        sys.path.insert(0, args.site)
    os.makedirs(args.outdir, exist_ok=True)
    build(args.outdir, "uint16", np.uint16, 50257, 0)
    build(args.outdir, "int32", np.int32, 200_000, 1)


if __name__ == "__main__":
    main()
