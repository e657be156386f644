"""The text corpus of `tokens.py text`: documents of real-looking English, their Parquet files,
a tokenizer, and the reference tokens.

- Words: the lexicon of the Python standard library's docstrings (this interpreter's), ranked by
  how often each word occurs there, drawn by a Zipf law over those ranks (exponent 1). Documents
  have log-normal lengths (median 245 words); sentences end with a period, some paragraphs with
  a blank line, some clauses with a comma, and the word after a period is capitalized.
- Files: `part-NNN.parquet`, one `text` column (UTF-8), several files of about `size / files`
  text bytes each, row groups of at most `row_group_mb` MiB of text. File k is drawn from seed
  (seed, k), so the corpus depends only on its arguments and the Python version (the lexicon).
- Tokenizer: a `tokenizer.json` given, else a byte-level BPE of 50257 tokens (GPT-2's size and
  pre-tokenizer, `<|endoftext|>` its end-of-text token) trained by the `tokenizers` package on
  the first file's documents (the vocabulary stops short of 50257 where the text has no more
  pairs to merge).
- Reference: the `tokenizers` package's `encode_batch` of every document, in file order, the
  end-of-text token after each, as one uint16 file (`tokens-DIGEST-DIGEST.bin`, digests of the
  tokenizer file and of the corpus's manifest), encoded one file a process. It is both what
  every row's windows are checked against and the data of the pre-tokenized row.

Everything is written once into the cache folder and reused while its arguments match.
"""

import hashlib
import json
import os
import re
import shutil
import sysconfig
from multiprocessing import get_context

import numpy as np

EOS = "<|endoftext|>"
VOCAB = 50257
_DOCSTRING = re.compile(r"(?:\"\"\"|''')(.*?)(?:\"\"\"|''')", re.S)
_WORD = re.compile(r"[A-Za-z][a-z]+(?:'[a-z]+)?|[A-Z]+|[a-z]|\d+")
# After each word: a space, a comma (1 in 12), a period (1 in 16), or a period that ends a
# paragraph (1 in 80): separator k follows a uniform draw below the first k bounds.
_SEPARATORS = np.array([" ", ", ", ". ", ".\n\n"], dtype=object)
_SEPARATOR_BOUNDS = np.cumsum([1 / 80, 1 / 16, 1 / 12])[::-1]
# Words a document: log-normal, median e^5.5 (about 245), clipped.
_DOC_LOG_MEDIAN, _DOC_LOG_SIGMA, _DOC_WORDS = 5.5, 1.0, (8, 20000)


def _cores():
    return len(os.sched_getaffinity(0))


def lexicon():
    """The standard library's docstring words, most frequent first (ties by spelling); a
    capitalized word counts as its lower-case self."""
    stdlib = sysconfig.get_paths()["stdlib"]
    skip = {"test", "tests", "site-packages", "idle_test", "__pycache__"}
    counts = {}
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith("lib2to3"))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                source = f.read()
            for doc in _DOCSTRING.findall(source):
                for w in _WORD.findall(doc):
                    if w[0].isupper() and w[1:].islower():
                        w = w.lower()
                    counts[w] = counts.get(w, 0) + 1
    return sorted(counts, key=lambda w: (-counts[w], w))


def _documents(words, seed, target_bytes):
    """Documents of about `target_bytes` UTF-8 bytes in all, drawn from `seed`."""
    rng = np.random.default_rng(seed)
    lower = np.array(words, dtype=object)
    upper = np.array([w[:1].upper() + w[1:] for w in words], dtype=object)
    zipf = np.cumsum(1.0 / np.arange(1, len(words) + 1))
    zipf /= zipf[-1]
    docs, size = [], 0
    while size < target_bytes:
        lengths = np.clip(
            rng.lognormal(_DOC_LOG_MEDIAN, _DOC_LOG_SIGMA, 512).astype(np.int64), *_DOC_WORDS
        )
        n = int(lengths.sum())
        rank = np.minimum(np.searchsorted(zipf, rng.random(n)), len(words) - 1)
        u = rng.random(n)
        sep = sum((u < b).astype(np.int64) for b in _SEPARATOR_BOUNDS)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        capital = np.zeros(n, dtype=bool)
        capital[1:] = sep[:-1] >= 2
        capital[starts] = True
        pieces = np.empty(2 * n, dtype=object)
        pieces[0::2] = np.where(capital, upper[rank], lower[rank])
        pieces[1::2] = _SEPARATORS[sep]
        for s, k in zip(starts, lengths):
            doc = "".join(pieces[2 * s : 2 * (s + k) - 1]) + "."
            docs.append(doc)
            size += len(doc)  # ASCII: characters are bytes
            if size >= target_bytes:
                break
    return docs


def _write_file(job):
    """Writes one Parquet file of the corpus (run in a pool: one file a process)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path, words, seed, target_bytes, group_bytes = job
    docs = _documents(words, seed, target_bytes)
    tmp = path + ".tmp"
    with pq.ParquetWriter(tmp, pa.schema([("text", pa.string())])) as w:
        start, size = 0, 0
        for i, d in enumerate(docs):
            size += len(d)
            if size >= group_bytes or i == len(docs) - 1:
                w.write_table(pa.table({"text": docs[start : i + 1]}), row_group_size=1 << 30)
                start, size = i + 1, 0
    os.replace(tmp, path)
    return len(docs)


def make_parquet(folder, size_gb, files, row_group_mb, seed=0):
    """The corpus's Parquet files in `folder` (written unless its manifest matches), with its
    manifest: {"files", "documents", "text_bytes", "lexicon_words", ...}."""
    want = {"size_gb": size_gb, "files": files, "row_group_mb": row_group_mb, "seed": seed}
    manifest = os.path.join(folder, "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            have = json.load(f)
        if {k: have.get(k) for k in want} == want:
            return have
    os.makedirs(folder, exist_ok=True)
    words = lexicon()
    per_file = int(size_gb * 1e9 / files)
    paths = [os.path.join(folder, f"part-{k:03d}.parquet") for k in range(files)]
    jobs = [(p, words, (seed, k), per_file, row_group_mb << 20) for k, p in enumerate(paths)]
    with get_context("spawn").Pool(min(files, _cores())) as pool:
        documents = pool.map(_write_file, jobs)
    have = dict(
        want,
        paths=paths,
        documents=sum(documents),
        text_bytes=per_file * files,
        lexicon_words=len(words),
    )
    with open(manifest, "w") as f:
        json.dump(have, f, indent=1)
    return have


def texts(path):
    """The documents of one Parquet file, as Python strings."""
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=["text"]).column("text").to_pylist()


def train_tokenizer(path, sample_path, sample_bytes=16 << 20):
    """A byte-level BPE of VOCAB tokens (GPT-2's pre-tokenizer, EOS among its tokens) trained on
    about `sample_bytes` of `sample_path`'s documents, saved at `path` unless there."""
    if os.path.exists(path):
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    sample, size = [], 0
    for doc in texts(sample_path):
        sample.append(doc)
        size += len(doc)
        if size >= sample_bytes:
            break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sample, trainer)
    tok.save(path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:12]


def _encode_file(job):
    """Encodes one Parquet file's documents into a uint16 file (run in a pool: one file a
    process, each encode_batch on one thread)."""
    path, tokenizer, out, batch = job
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    eos = tok.token_to_id(EOS)
    docs = texts(path)
    with open(out, "wb") as f:
        for i in range(0, len(docs), batch):
            ids = []
            for e in tok.encode_batch(docs[i : i + batch]):
                ids.extend(e.ids)
                ids.append(eos)
            np.array(ids, dtype=np.uint16).tofile(f)


def reference_tokens(folder, paths, tokenizer, batch=4096):
    """The uint16 reference token file (`encode_batch` of every document in file order, EOS
    after each), written unless there (named for the tokenizer and the corpus's manifest); its
    path and token count."""
    from tokenizers import Tokenizer

    manifest = os.path.join(os.path.dirname(paths[0]), "manifest.json")
    out = os.path.join(folder, f"tokens-{digest(tokenizer)}-{digest(manifest)}.bin")
    if not os.path.exists(out):
        tok = Tokenizer.from_file(tokenizer)
        if tok.get_vocab_size() > 1 << 16 or tok.token_to_id(EOS) is None:
            raise ValueError(f"{tokenizer}: needs {EOS} and at most 65536 tokens (uint16)")
        parts = [f"{out}.{k}" for k in range(len(paths))]
        jobs = [(p, tokenizer, part, batch) for p, part in zip(paths, parts)]
        # One file a process, whose encode_batch stays on one thread (the spawned processes
        # take the variable from this one's environment).
        was = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            with get_context("spawn").Pool(min(len(paths), _cores())) as pool:
                pool.map(_encode_file, jobs)
        finally:
            os.environ.pop("TOKENIZERS_PARALLELISM")
            if was is not None:
                os.environ["TOKENIZERS_PARALLELISM"] = was
        with open(out + ".tmp", "wb") as f:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, f, 1 << 24)
                os.remove(part)
        os.replace(out + ".tmp", out)
    return out, os.path.getsize(out) // 2
