"""A text column's ids are the ``tokenizers`` package's ``encode_batch``: on text made to reach
every edge of GPT-2's and Llama 3's patterns (runs of spaces, line ends, contractions, other
scripts, emoji, an end-of-text token written in a document), for byte-level tokenizers that
pinfeed runs without the library's bookkeeping (GPT-2's shape, Llama 3's split then bytes, a
template around each document) and for one it leaves to the library. A tokenizer saved with
truncation still packs whole documents."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pinfeed

tk = pytest.importorskip("tokenizers")

PARTS = [
    " ", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u3000", "'s", "'t", "'ll",
    "'", "the", "The", "ing", "a", "é", "naïve", "中文", "Ⅻ", "٣", "0", "42", "3.14", "e\u0301",
    "🙂", "!", "...", "-", "<", "|", ">", "endoftext", "<|endoftext|>",
]  # fmt: skip
EOS = "<|endoftext|>"
BOS = "<|begin_of_text|>"
LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def texts(n, seed):
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(PARTS, int(rng.integers(1, 40)))) for _ in range(n)]


def tokenizer(path, prefix_space=True, normalizer=None, truncate=None, split=False, bos=False):
    tok = tk.Tokenizer(tk.models.BPE())
    bytes_ = tk.pre_tokenizers.ByteLevel(add_prefix_space=prefix_space, use_regex=not split)
    tok.pre_tokenizer = bytes_
    if split:
        regex = tk.pre_tokenizers.Split(tk.Regex(LLAMA3), behavior="isolated")
        tok.pre_tokenizer = tk.pre_tokenizers.Sequence([regex, bytes_])
    if normalizer is not None:
        tok.normalizer = normalizer
    trainer = tk.trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=[EOS, BOS],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(400, seed=1), trainer)
    if bos:
        tok.post_processor = tk.processors.TemplateProcessing(
            single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))]
        )
    if truncate:
        tok.enable_truncation(truncate)
    tok.save(str(path))
    tok.no_truncation()
    return tok


@pytest.mark.parametrize(
    "shape",
    [
        "gpt2",
        "prefix space",
        "normalizer",
        "truncation",
        "llama3",
        "llama3 with bos",
        "gpt2 with bos",
    ],
)
def test_windows_are_encode_batch_of_every_document(tmp_path, shape):
    kw = {
        "gpt2": dict(prefix_space=False),
        "prefix space": dict(prefix_space=True),
        "normalizer": dict(normalizer=tk.normalizers.NFKC()),
        "truncation": dict(prefix_space=False, truncate=4),
        "llama3": dict(prefix_space=False, split=True),
        "llama3 with bos": dict(prefix_space=False, split=True, bos=True),
        "gpt2 with bos": dict(prefix_space=False, bos=True),
    }[shape]
    tok = tokenizer(tmp_path / "tokenizer.json", **kw)
    docs = texts(300, seed=2)
    assert any(EOS in d for d in docs) and any("   " in d for d in docs)
    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"text": docs}), path, row_group_size=50)
    eos = tok.token_to_id(EOS)
    want = np.concatenate([e.ids + [eos] for e in tok.encode_batch(docs)])
    loader = pinfeed.TokenLoader(
        path,
        32,
        4,
        column="text",
        tokenizer=tmp_path / "tokenizer.json",
        eos_token=EOS,
        sample="sequential",
        device="cpu",
    )
    assert loader.num_tokens == len(want)
    x = np.concatenate([step[0] for step in loader]).reshape(-1)
    np.testing.assert_array_equal(x, want[: len(x)])
    assert len(x) == (len(want) - 1) // 32 * 32
