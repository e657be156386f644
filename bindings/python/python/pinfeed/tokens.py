"""``pinfeed.TokenLoader``: token windows for language-model training, as ``(x, y)`` batches.

nanoGPT's ``get_batch`` in two lines::

    loader = pinfeed.TokenLoader("train.bin", seq_len=1024, batch_size=12, token_dtype="uint16")
    for x, y in loader:  # int64 CUDA tensors (12, 1024), y shifted by one
        ...
"""

import os
from collections.abc import Iterator, Mapping
from typing import Any, Optional, Union

import numpy as np

from . import _pinfeed
from ._deprecation import accepts_old_spellings, warn_once
from ._epochs import EpochLoader
from ._frameworks import check_dtype, framework_arg, module
from ._grouped import GroupedLoader
from ._mixture import mixture_of, name_of, reblended
from ._options import int_arg, ints, shuffle_arg
from ._sources import source_path, store_args
from ._tables import decodes_of, open_column, packed, token_shuffle, with_decodes
from ._widen import segment_ids, widen_xy
from .errors import PinfeedTypeError, PinfeedValueError
from .loader import Loader

__all__ = ["TokenLoader"]

_SAMPLES = ("random", "sequential", "documents")
# Random steps in one loader batch: about this many tokens, at most _MAX_GROUP steps.
_GROUP_TOKENS = 512 << 10
_MAX_GROUP = 16
_INT_DTYPES = ("int64", "int32")


def _is_int_dtype(dtype: Any) -> bool:
    """Whether numpy reads ``dtype`` as an integer type."""
    try:
        return np.dtype(dtype).kind in "iu"
    except TypeError:
        return False


def _typestr(dtype: Any) -> str:
    """A token dtype as the Rust side parses it: a name or typestring as given, else numpy's
    typestring."""
    return dtype if isinstance(dtype, str) else np.dtype(dtype).str


def _old_dtypes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The old meaning of ``dtype`` (a stored width such as ``"uint16"``, now ``token_dtype``)
    and ``int_dtype`` (now ``dtype``), each warning once."""
    dtype = kwargs.get("dtype")
    if dtype is not None and _is_int_dtype(dtype) and np.dtype(dtype).name not in _INT_DTYPES:
        if kwargs.get("token_dtype") is not None:
            raise PinfeedTypeError(
                f"TokenLoader: dtype={dtype!r} is a stored token width (the old meaning of "
                "dtype) and token_dtype is given too; give token_dtype only"
            )
        warn_once(
            "TokenLoader",
            f"dtype={dtype!r} (a stored token width)",
            f"use token_dtype={dtype!r}; dtype is now what x and y are (int64 or int32)",
        )
        kwargs["token_dtype"] = kwargs.pop("dtype")
    if "int_dtype" in kwargs:
        if kwargs.get("dtype") is not None:
            raise PinfeedTypeError("TokenLoader: give dtype= only (int_dtype= is its old name)")
        warn_once("TokenLoader", "int_dtype=", "use dtype= instead")
        kwargs["dtype"] = kwargs.pop("int_dtype")
    return args


class TokenLoader(EpochLoader):
    """Batches of token windows from a token file, streamed through pinfeed's pinned ring.

    ``source`` is a raw token file (nanoGPT's ``train.bin``: give ``token_dtype``, ``"uint16"``
    or ``"uint32"``), a 1-D integer ``.npy`` (its dtype from the header), a directory or glob of
    such files read as one stream in sorted name order, or a Megatron indexed dataset (a
    ``.bin`` beside its ``.idx``, or their common prefix; its dtype from the ``.idx``).

    Each step reads one ``(batch_size, seq_len + 1)`` array of tokens at their stored width
    (2 bytes a token for uint16) into a pinned slot and copies it to the device; there the
    inputs ``x = b[:, :-1]`` and targets ``y = b[:, 1:]`` are widened to ``dtype``
    (``"int64"``, or ``"int32"``) on torch's current stream. Iterating yields ``(x, y)``:
    contiguous CUDA tensors of shape ``(batch_size, seq_len)``, or numpy arrays on the host
    backend (``device="cpu"``, or ``"auto"`` without a GPU). Random steps, and a mixture's,
    travel up to 16 to a pinned slot (about 512 Ki tokens): their ``x`` and ``y`` are widened
    together, on the stream current when the first of them is taken, and are slices of one
    tensor that stays alive while any of them does; a step used on another stream needs
    ``record_stream``, as any torch tensor does.

    ``framework`` (``"torch"``, ``"jax"``, ``"cupy"`` or ``"numpy"``, as for
    :class:`pinfeed.Loader`) picks what ``x``, ``y`` (and ``segment_ids``) are; JAX widens
    them in one jitted function, CuPy on its current stream. ``dtype`` defaults to
    ``"int64"``, but ``"int32"`` for JAX without ``jax_enable_x64``.

    ``sample`` picks the windows:

    - ``"random"`` (nanoGPT): windows at uniformly random token offsets, with replacement.
      Window ``v`` of an epoch starts at an offset drawn from ``(seed, epoch, v)``
      (:meth:`offsets` gives them); step ``i`` on rank ``r`` reads windows
      ``(i × world_size + r) × batch_size ..``, so the global batch of a step does not depend
      on the number of ranks. With ``steps``, an iteration is ``steps`` batches and
      ``len()`` is ``steps``; without, the stream is endless (2^40 windows) and ``len()``
      raises ``TypeError``, as for an iterator without a length.
    - ``"sequential"``: consecutive windows every ``seq_len`` tokens (each window's last
      target is the next one's first input), every window once an epoch, split across ranks as
      :class:`pinfeed.Loader` splits records; ``shuffle=True`` permutes the windows each epoch.
    - ``"documents"`` (a Megatron dataset, or a table's ``column``, a document a row): the
      documents in a shuffled order of ``(seed, epoch)`` (a Fisher-Yates shuffle, or a table's
      row-group-aware order, below; empty ones left out), concatenated and cut as
      ``"sequential"``; yields ``(x, y, segment_ids)``,
      ``segment_ids`` int32 ``(batch_size, seq_len)`` aligned with ``x``: the ordinal of each
      input token's document within its window (``0, 0, 0, 1, 1, 2, ...``), for document
      masking. The ids travel in the same slot as the tokens. ``seq_len + 1`` is at most 65535.

    Every mode is deterministic in ``(seed, epoch, step)``, sharded by ``rank`` and
    ``world_size`` (defaults as :class:`pinfeed.Loader`: ``torch.distributed``, else
    ``$RANK``/``$WORLD_SIZE``), and resumable exactly: after :meth:`load_state_dict` the next
    iteration delivers exactly the batches the interrupted run had not received. Each iteration
    runs the next epoch; :meth:`set_epoch` picks one.

    ``source`` may be a URL in object storage, as for :class:`pinfeed.Loader`: one object
    (``s3://bucket/train.bin``), a prefix's ``.npy`` objects (``s3://bucket/tokens/``) or a
    glob of objects (``s3://bucket/tokens/shard_*.bin``) read as one stream in byte order of
    their keys; ``gs://``, ``az://`` and ``https://`` too. Windows are fetched by ranged GETs
    straight into the pinned slots, at most ``queue_depth`` (default 32) in flight;
    ``storage_options``, ``cache_dir`` and ``cache_limit`` are :class:`pinfeed.Loader`'s (and
    refused, as there, for a local path). The objects are listed and their headers read once,
    when the loader is made; every epoch's windows are cut from what was opened. Random and
    sequential windows both work over a network: a batch's random windows are ranged GETs in
    flight together (neighbours coalesced), sequential ones consecutive ranges; a Megatron index
    is read from local disk only, so ``"documents"`` over a URL takes a table's ``column``
    (a raw ``.bin`` object has no documents).
    ``stats()["network"]`` counts the current pass's fetches.

    ``source`` may also be a table (Parquet, Arrow IPC or JSON lines, or a directory or glob of
    them, locally or in object storage; the ``tokenizer.json`` is a local file) with ``column``: a column of integer lists (``"input_ids"``) is read as one stream,
    the rows' lists concatenated in order; a text column with ``tokenizer`` (a
    ``tokenizer.json``) is tokenized on the reader threads (as the Python ``tokenizers``
    package's ``encode`` does, ``bos_token`` before and ``eos_token`` after each document; a
    str is a token, an int an id) into uint32 tokens, and each step is ``(x, y, segment_ids,
    position_ids, cu_seqlens)``: a document starts at a window's start, at ``bos_token`` and
    after ``eos_token``, ``position_ids`` restart at each, and ``cu_seqlens`` (int32) are the
    documents' bounds in the flattened batch. Making the loader tokenizes each file once, on
    idle cores, to count its tokens, and keeps them on local disk (``text-tokens`` in
    ``$PINFEED_CACHE_DIR`` or ``~/.cache/pinfeed``, keyed by the file's path, size, mtime and
    the tokenizer; at most ``$PINFEED_TEXT_CACHE_BYTES``, by default half the free space),
    whence every later read of an unchanged file comes. With ``sample="documents"`` each row is
    a document: ``segment_ids`` (and for text the ``position_ids`` and ``cu_seqlens``) follow
    the rows. A read decodes (or reads back) its whole row group unless the 1 GiB cache of
    decoded ones holds it, so a table's shuffled orders are row-group aware: ``shuffle=True``
    (``"block"``) puts the row groups in a shuffled order of ``(seed, epoch)``, takes them a
    few at a time (as many as decode to half the cache) and permutes the windows of each few
    among themselves; ``"documents"`` orders its rows so (``shuffle=True`` permutes each few's
    windows too). Each row group is then decoded about once an epoch. ``shuffle="random"``
    asks for the global permutation (of the documents too), which decodes a row group for
    nearly every window once the column outgrows the cache, as random windows do.
    ``stats()["chunk_decodes"]`` counts a pass's decodes.

    **Mixtures**: ``source`` may be a dict of name to source (a path, a URL, or
    :class:`pinfeed.Source` with its own ``token_dtype`` and object-store options), with
    ``weights={name: share}`` or a curriculum ``[(from_step, {name: share}), ...]``.
    ``mode="exact"`` (default) gives every step (the global batch, ``world_size ×
    batch_size`` windows) each source's share, rounded so the counts add up, in the order of
    Megatron's blend; ``"sampled"`` draws each window's source from ``(seed, epoch, i)``.
    ``on_exhausted`` (one policy, or a dict by name) says what a source does when a pass of it
    runs out: ``"cycle"`` (a new pass in a new order; the default for random windows),
    ``"stop"`` (the epoch ends; the default for sequential ones), ``{"samples": n}`` or
    ``{"passes": n}`` an epoch, after which it leaves the blend. ``steps`` sets an epoch's
    length for sequential windows too. Sources stored at different widths are read at one
    that holds them all. The state holds the schedule and each source's position (resume,
    elastic resume); :meth:`set_weights` changes the weights from a step on;
    ``stats()["sources"]`` counts each source.

    ``pinned_budget``, ``num_threads``, ``prefetch`` and ``device`` are
    :class:`pinfeed.Loader`'s.
    """

    @accepts_old_spellings("TokenLoader", _old_dtypes)
    def __init__(
        self,
        source: Union[str, "os.PathLike[str]", Mapping[str, Any]],
        seq_len: int,
        batch_size: int,
        *,
        device: Any = "auto",
        framework: Optional[str] = None,
        shuffle: Union[bool, str] = False,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: bool = False,
        pinned_budget: Any = None,
        num_threads: Optional[int] = None,
        prefetch: int = 4,
        storage_options: Optional[dict[str, Any]] = None,
        cache_dir: Any = None,
        cache_limit: Any = None,
        queue_depth: Optional[int] = None,
        dtype: Optional[str] = None,
        token_dtype: Any = None,
        sample: str = "random",
        steps: Optional[int] = None,
        column: Optional[str] = None,
        tokenizer: Any = None,
        eos_token: Any = None,
        bos_token: Any = None,
        weights: Any = None,
        mode: str = "exact",
        on_exhausted: Any = None,
    ) -> None:
        mixed = isinstance(source, Mapping)
        self.source = name_of(source) if mixed else source_path(source, "TokenLoader")
        self._store = store_args(storage_options, cache_dir, cache_limit, queue_depth, self.source)
        framework = framework_arg(framework)
        asked = shuffle_arg(shuffle, ("none", "random", "block"), "TokenLoader")
        self.sample = self._sample_arg(sample, asked, None if mixed else steps)
        self.seq_len, self.batch_size, self.seed = ints(
            self.source, seq_len=seq_len, batch_size=batch_size, seed=seed
        )
        self.steps = None if steps is None else int_arg(self.source, "steps", steps)
        #: The integer type ``x`` and ``y`` are delivered as: ``"int64"`` or ``"int32"``.
        self.dtype: str = self._dtype_arg(dtype, framework)
        # "uint16", "<u2", numpy.uint16: the Rust side parses names and typestrings.
        self._token_dtype = None if token_dtype is None else _typestr(token_dtype)
        # Token data as first opened (object-store listing and headers, or a table's column):
        # later epochs' windows are cut from it. None for local files, opened again each time.
        self._opened = self._open_column(
            column, tokenizer, (bos_token, eos_token), framework, mixed
        )
        #: ``"none"``, ``"random"`` (windows permuted each epoch) or ``"block"`` (a table's
        #: column, row group by row group; its ``shuffle=True``).
        self.shuffle: str = token_shuffle(shuffle, asked, column is not None)
        self._shared(
            rank,
            world_size,
            device=device,
            drop_last=drop_last,
            shuffle="random" if self.shuffle == "random" else "none",  # "block": the source's
            seed=self.seed,
            pinned_budget=pinned_budget,
            num_threads=num_threads,
            prefetch=prefetch,
            raw=True,
            framework=framework,
        )
        self._mixture = mixture_of(source, self, weights, mode, on_exhausted)
        self._plan_epochs()
        self._first_loader()
        #: What ``x`` and ``y`` are: ``"torch"``, ``"jax"``, ``"cupy"`` or ``"numpy"``.
        self.framework: str = framework or ("torch" if self.device.startswith("cuda") else "numpy")
        # Steps the consumer took in the current pass's epoch (its position, in steps).
        self._steps_done = 0

    def _plan_epochs(self) -> None:
        """Steps a loader batch, and whether each epoch has a Loader of its own: random and
        document windows are drawn anew each epoch, by a new source; sequential windows are one
        source whose epochs the Loader runs, but for a table's block shuffle, whose order is
        drawn each epoch. Each epoch of a mixture is a new blend, read in its order by a
        GroupedLoader, whose batches (positions) are steps."""
        self._group = self._steps_per_batch()
        mixed = self._mixture is not None
        self._per_epoch = self.sample != "sequential" or self.shuffle == "block" or mixed
        if mixed:
            self._mixed_group, self._group = self._group, 1
            self._loader_args["shuffle"] = "none"

    def _steps_per_batch(self) -> int:
        """Random steps, and a mixture's, travel several to a loader batch (about 512 Ki
        tokens, at most _MAX_GROUP steps): one slot, one copy and one widening for all of them,
        so the consumer's per-step work is two slices. Each step still gets exactly its own
        windows (Rust numbers them so: open_tokens for one source, StepGroups for a mixture);
        other modes take one step a batch, and so does text, whose steps are cut by their
        batch's document count."""
        tokens_per_step = self.batch_size * (self.seq_len + 1)
        if (self.sample != "random" and self._mixture is None) or self._text is not None:
            return 1
        return max(1, min(_MAX_GROUP, -(-_GROUP_TOKENS // tokens_per_step)))

    def _sample_arg(self, sample: Any, shuffle: Any, steps: Any) -> str:
        if sample not in _SAMPLES:
            raise PinfeedValueError(
                f"{self.source}: unknown sample {sample!r}: expected one of {', '.join(_SAMPLES)}"
            )
        if sample == "random" and shuffle != "none":
            raise PinfeedValueError(
                f"{self.source}: shuffle applies to sample='sequential' or 'documents'; random "
                "windows are drawn at random already"
            )
        if steps is not None and sample != "random":
            raise PinfeedValueError(
                f"{self.source}: steps applies to sample='random'; sequential and document "
                "windows have a length (batches per epoch)"
            )
        return sample

    def _open_column(
        self,
        column: Any,
        tokenizer: Any,
        bos_eos: tuple[Any, Any],
        framework: Optional[str],
        mixed: bool,
    ) -> Optional["_pinfeed.TokenStream"]:
        """A table's ``column`` opened (None without one); with text, sets :attr:`_text`, the
        ids of ``bos_eos``: steps then also carry position ids and ``cu_seqlens``."""
        self._text: Optional[tuple[Optional[int], Optional[int]]] = None
        if column is None and tokenizer is None:
            return None
        if mixed:
            raise PinfeedValueError(
                f"{self.source}: column= and tokenizer= read one table; the sources of a "
                "mixture are token data so far"
            )
        documents = self.sample == "documents"
        opened, self._text = open_column(
            self.source, column, tokenizer, bos_eos, self._token_dtype, documents, self._store
        )
        if self._text is not None and framework in ("jax", "cupy"):
            raise PinfeedValueError(
                f"{self.source}: a tokenized text column delivers torch tensors or numpy "
                f"arrays so far, not framework={framework!r}"
            )
        return opened

    def _dtype_arg(self, dtype: Any, framework: Optional[str]) -> str:
        if dtype is None:
            # JAX without jax_enable_x64 has no int64 arrays.
            x64 = framework != "jax" or module("jax").config.jax_enable_x64
            dtype = "int64" if x64 else "int32"
        name = np.dtype(dtype).name if _is_int_dtype(dtype) else dtype
        if name not in _INT_DTYPES:
            raise PinfeedValueError(
                f"{self.source}: dtype (what x and y are) must be 'int64' or 'int32', not "
                f"{dtype!r}; the stored token width is token_dtype"
            )
        check_dtype(framework, np.dtype(name), self.source)
        return name

    def _make_loader(self, epoch: int) -> Union[Loader, GroupedLoader]:
        if self._mixture is not None:
            source, typestr, num_tokens, fingerprint = self._mixture.open(epoch)
            self._source_fingerprint, self._order_fingerprint = fingerprint, None
            self.token_dtype, self.num_tokens = np.dtype(typestr), int(num_tokens)
            return GroupedLoader(
                source, self.batch_size, self._mixed_group, epoch, self._loader_args
            )
        source, typestr, num_tokens, self._opened, fingerprint, order = _pinfeed.open_tokens(
            self.source,
            seq_len=self.seq_len,
            batch_size=self.batch_size,
            dtype=self._token_dtype,
            sample=self.sample,
            seed=self.seed,
            steps=self.steps,
            world_size=self.world_size,
            epoch=epoch,
            steps_per_batch=self._group,
            opened=self._opened,
            # Tokens the output type cannot hold fail on the reader threads (Rust).
            output=self.dtype,
            shuffle=self.shuffle,
            **self._store,
        )
        # The data's own hash (Rust): a state is not resumed on other tokens of the same size;
        # nor under another row-group-aware rule (None where the order is not one).
        self._source_fingerprint: int = fingerprint
        self._order_fingerprint: Optional[int] = order
        #: numpy dtype of the tokens as stored.
        self.token_dtype: np.dtype = np.dtype(typestr)
        #: Tokens in the data.
        self.num_tokens: int = int(num_tokens)
        return Loader(source, self.batch_size * self._group, **self._loader_args)

    def __len__(self) -> int:
        if self.sample == "random" and self.steps is None:
            raise PinfeedTypeError(
                "TokenLoader(sample='random') without steps is endless and has no len(); "
                "pass steps= for a run of a set length"
            )
        if self.sample == "random":
            return self.steps
        return len(self._loader)

    def _start_of(self, epoch: int) -> tuple[int, int]:
        return (epoch, 0)

    def _begin(self, loader: Loader, start: tuple[int, int]) -> Iterator[tuple[Any, ...]]:
        # Positions the Loader at the batch holding the first step to deliver (a pass it
        # started already at this position is kept), then skips the steps before it.
        state = loader.state_dict()
        batches_done, skip = divmod(start[1], self._group)
        loader.load_state_dict({**state, "epoch": start[0], "batches_done": batches_done})
        self._steps_done = start[1]
        if self._mixture is not None:
            return self._mixed_steps(iter(loader))
        self._decodes_before = decodes_of(self._opened)
        passed = iter(loader)
        if self._text is not None:
            # A text step is a batch (`_steps_per_batch`): the batch's count is the step's.
            steps = self._batches(passed, skip)
            return packed(steps, self._text, self.device, lambda: passed.documents)
        return self._batches(passed, skip)

    def _batches(self, batches: Iterator[Any], skip: int) -> Iterator[tuple[Any, ...]]:
        width = self.token_dtype.itemsize
        tokens_bytes = (self.seq_len + 1) * width
        kind = self.framework
        b = self.batch_size
        for raw in batches:
            if self.sample == "documents":
                tok, ids = raw[:, :tokens_bytes], raw[:, tokens_bytes:]
                self._steps_done += 1
                yield (*self._xy(tok, kind), self._segment_ids(ids, kind))
                continue
            if self._group == 1:
                self._steps_done += 1
                yield self._xy(raw, kind)
                continue
            x, y = self._xy(raw, kind)
            for k in range(skip, int(raw.shape[0]) // b):
                if self.steps is not None and self._steps_done >= self.steps:
                    return  # the last batch's steps past `steps` are not this run's
                batches.check_not_cut()  # close() or a new iter() cuts the pass at once
                self._steps_done += 1
                yield x[k * b : (k + 1) * b], y[k * b : (k + 1) * b]
            skip = 0

    def _mixed_steps(self, steps: Iterator[tuple[Any, int, int]]) -> Iterator[tuple[Any, Any]]:
        """A mixture's steps: each loader batch widened once, then cut into its steps."""
        held = x = y = None
        for raw, start, end in steps:
            if raw is not held:
                held, (x, y) = raw, self._xy(raw, self.framework)
            self._steps_done += 1
            yield x[start:end], y[start:end]

    def _xy(self, raw: Any, kind: str) -> tuple[Any, Any]:
        """``x`` and ``y`` of a ``(B, (seq_len + 1) × width)`` uint8 batch, widened."""
        return widen_xy(raw, self.token_dtype, self.dtype, self.seq_len, kind)

    def _segment_ids(self, raw: Any, kind: str) -> Any:
        """The int32 ``(B, seq_len)`` segment ids of the inputs, from their uint16 bytes."""
        return segment_ids(raw, self.seq_len, kind)

    def offsets(self, step: int, epoch: int = 0) -> np.ndarray:
        """The token offsets of this rank's windows at ``step`` of ``epoch`` (random sampling
        only): batch row ``k`` holds tokens ``offsets[k] .. offsets[k] + seq_len + 1``."""
        if self.sample != "random" or self._mixture is not None:
            raise PinfeedValueError(
                f"{self.source}: offsets are those of sample='random' over one source"
            )
        step, epoch = ints(self.source, step=step, epoch=epoch)
        first = (step * self.world_size + self.rank) * self.batch_size
        found = _pinfeed.token_offsets(
            self.seed, epoch, self.num_tokens - self.seq_len, first, self.batch_size
        )
        return np.asarray(found, dtype=np.int64)

    @property
    def num_samples(self) -> int:
        """Windows in one epoch, all ranks: ``steps × batch_size × world_size`` random windows
        (2^40 without ``steps``), or the sequential or document windows of the data."""
        if self.sample == "random" and self.steps is not None:
            return self.steps * self.batch_size * self.world_size
        return self._loader.num_samples

    @property
    def int_dtype(self) -> str:
        """Deprecated: :attr:`dtype`."""
        warn_once("TokenLoader", "int_dtype", "use dtype instead")
        return self.dtype

    def _token_params(self) -> dict[str, Any]:
        return {
            "sample": self.sample,
            "seq_len": self.seq_len,
            "num_tokens": self.num_tokens,
            "token_dtype": self.token_dtype.str,
            "steps": self.steps,
            "source_fingerprint": self._source_fingerprint,
            "order_fingerprint": self._order_fingerprint,
        }

    def state_dict(self) -> dict[str, Any]:
        """How far the consumer got: :meth:`pinfeed.Loader.state_dict`'s dict (``epoch`` and
        ``batches_done`` among it) under the token parameters it depends on, in ``"tokens"``."""
        state = dict(self._loader.state_dict())
        if self._next is not None:
            state["epoch"], state["batches_done"] = self._next
        elif self._group > 1 and self._pass_epoch is not None:
            # In steps, counted here: the Loader counts batches of several steps, handed over
            # whole, and a pass whose last batch went out is finished for it.
            if self.steps is not None and self._steps_done >= self.steps:
                state["epoch"], state["batches_done"] = self._pass_epoch + 1, 0
            else:
                state["epoch"], state["batches_done"] = self._pass_epoch, self._steps_done
        state["tokens"] = self._token_params()
        if self._mixture is not None:
            state["mixture"] = self._mixture.state(state)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration resume at ``state`` (from :meth:`state_dict`). Raises
        :class:`pinfeed.PinfeedValueError` when it was saved with other token parameters
        (sample, seq_len, data size, dtype, steps) or another Loader setting, or is not a
        TokenLoader state."""
        rest, epoch, steps_done = self._checked_state(
            state, "TokenLoader", "tokens", self._token_params()
        )
        if self._mixture is not None:
            # The saved schedule, then the blend of the saved epoch.
            self._mixture.adopt(rest.pop("mixture", None))
            self._loader.close()
            self._loader, self._loader_epoch = self._make_loader(epoch), epoch
            rest = reblended(rest, self._loader, self._loader.fingerprint_at)
        # The Loader checks the order's parameters and the position against its epoch.
        self._loader.load_state_dict(
            {**rest, "epoch": self._loader_epoch, "batches_done": steps_done // self._group}
        )
        self._next = (epoch, steps_done)
        if self._group == 1:
            # One step a batch: the Loader's position, moved to this world size on an
            # elastic resume, is the step to start at.
            moved = self._loader.state_dict()
            self._next = (int(moved["epoch"]), int(moved["batches_done"]))

    def stats(self) -> dict[str, Any]:
        """The counters of the current (or last) pass: :meth:`pinfeed.Loader.stats`; for a
        mixture, each source's in ``"sources"``; for a table's column, the row groups its reads
        decoded in ``"chunk_decodes"``; for text, ``"tokenized_rows"`` (by the process)."""
        stats = self._loader.stats()
        if self._text is not None:
            stats = {**stats, "tokenized_rows": _pinfeed.tokenized_rows()}
        if self._mixture is not None:
            return self._mixture.stats(stats)
        return with_decodes(stats, self._opened, getattr(self, "_decodes_before", None))

    def set_weights(self, weights: Mapping[str, float], from_step: Optional[int] = None) -> None:
        """A mixture's weights from global step ``from_step`` on (default: the next step),
        replacing the schedule from there; it is part of :meth:`state_dict`, so a resumed job
        keeps it. Call it between iterations: the next one runs the new schedule."""
        if self._mixture is None:
            raise PinfeedValueError(f"{self.source}: set_weights applies to a mixture")
        self.load_state_dict(self._mixture.reweighted(self.state_dict(), weights, from_step))

    def __repr__(self) -> str:
        return (
            f"TokenLoader({self.source!r}, seq_len={self.seq_len}, batch_size={self.batch_size}, "
            f"sample={self.sample!r}, token_dtype={self.token_dtype}, dtype={self.dtype}, "
            f"device={self.device!r}, rank={self.rank}, world_size={self.world_size})"
        )
