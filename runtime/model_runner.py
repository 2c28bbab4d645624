"""``ModelRunner``: the one API both services drive (open / extend / truncate / release).

Not thread-safe: one caller at a time (the services run it on one worker thread).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from specdec.kernels.attention import build_attention_metadata, create_attention_backend
from specdec.kernels.attention.cpu_backend import CpuAttentionBackend
from specdec.kernels.decoder_layers import NativeStep
from specdec.kernels.fp8 import is_fp8
from specdec.kernels.paged_kv_cache import PagedKVCache
from specdec.runtime.config import RuntimeConfig
from specdec.runtime.context import PagedContext
from specdec.runtime.kv_scales import KVScalesMismatchError, KVScaleTable
from specdec.runtime.loader import load_model
from specdec.runtime.prefix_cache import PrefixCache, root_key
from specdec.runtime.sequence import SequenceChunk


class ModelRunner:
    """A model plus its paged KV cache, driven one ragged step (``extend``) at a time.

    Invariants: every open sequence's cached length equals the number of tokens extended
    into it (minus truncations); a failing ``extend`` changes no sequence. With prefix
    caching on, a chunk's leading full blocks may come from the cache instead of a forward
    (``PrefixCache.match``), and every block a sequence completes is published for others.
    """

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        mc = config.model_config
        self.model_config = mc
        self.device = torch.device(config.device)
        self.kv_torch_dtype = config.kv_torch_dtype
        self.model, found_scales = load_model(
            config.model,
            mc,
            config.resolved_max_model_len,
            config.compute_dtype,
            self.device,
        )
        self.cache = PagedKVCache(
            num_layers=mc.num_layers,
            num_pages=config.resolved_num_pages,
            page_size=config.page_size,
            num_kv_heads=mc.num_kv_heads,
            head_dim=mc.head_dim,
            dtype=self.kv_torch_dtype,
            device=self.device,
        )
        self.backend = create_attention_backend(config.attention_backend, self.device)
        # The C attention backend brings the C kernels for the rest of the layer with it;
        # the reference stays PyTorch throughout.
        self.cpu_kernels = self.model.use_cpu_kernels(
            isinstance(self.backend, CpuAttentionBackend), config.torch_dtype, config.quantization
        )
        self.cache.use_cpu_kernels(self.cpu_kernels)
        self._sm_scale = mc.head_dim**-0.5
        self._seq_tables: dict[str, KVScaleTable] = {}
        self.forward_seconds = 0.0  # wall time inside extend's forward passes
        self._prefix = PrefixCache(self.cache) if config.enable_prefix_caching else None
        self.prefix_cache_queries = 0  # tokens of full blocks chunks could take from the cache
        self.prefix_cache_hits = 0  # tokens of those taken (attached, not computed)
        self.num_computed_tokens = 0  # tokens run through forwards (extend, decode_greedy)
        self.last_prefix_hits: dict[str, int] = {}  # the last extend's hits, per sequence
        if config.kv_scales_path:
            table = KVScaleTable.load(config.kv_scales_path)
        else:
            table = KVScaleTable.from_checkpoint(found_scales, mc.num_layers, config.kv_cache_dtype)
        self.set_kv_scales(table or KVScaleTable.ones(mc.num_layers, config.kv_cache_dtype))

    @classmethod
    def from_pretrained(cls, path: str | Path, **config_overrides: Any) -> ModelRunner:
        """``ModelRunner(RuntimeConfig(model=path, **config_overrides))``."""
        return cls(RuntimeConfig(model=str(path), **config_overrides))

    # ---- facts ---------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return Path(self.config.model).resolve().name

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def max_model_len(self) -> int:
        return self.config.resolved_max_model_len

    @property
    def num_layers(self) -> int:
        return self.model_config.num_layers

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.model_config.eos_token_ids

    @property
    def kv_cache_dtype(self) -> str:
        return self.config.kv_cache_dtype

    @property
    def num_free_pages(self) -> int:
        return self.cache.num_free_pages

    @property
    def decodes_greedy_in_c(self) -> bool:
        """Whether ``decode_greedy`` runs here (else it answers None): the layers run in C
        with a packed head, the cache is written in C, and the C attention kernel takes a
        token's GQA group of query rows; not for a model that reads the target's features."""
        group = self.model_config.num_heads // self.model_config.num_kv_heads
        return (
            not self.model_config.reads_target_features  # each pick reads the one before
            and self.model.greedy_head() is not None
            and self.cache.writes_in_c
            and isinstance(self.backend, CpuAttentionBackend)
            and group <= self.backend.native_max_rows
        )

    # ---- KV scales -------------------------------------------------------------------------

    @property
    def kv_scales(self) -> KVScaleTable:
        return self._kv_scales

    def set_kv_scales(self, table: KVScaleTable) -> None:
        """Replace the KV-scale table.

        ValueError if it has the wrong number of layers or a different KV dtype. On an
        FP8 cache, sequences holding tokens written under the old table are refused by
        ``extend`` (``KVScalesMismatchError``) until released.
        """
        if table.num_layers != self.num_layers:
            raise ValueError(
                f"KV-scale table has {table.num_layers} layers, the model has {self.num_layers}"
            )
        from specdec.kernels.fp8 import resolve_kv_cache_dtype

        if resolve_kv_cache_dtype(table.dtype, self.config.compute_dtype) != self.kv_torch_dtype:
            raise ValueError(
                f"KV-scale table is for kv_cache_dtype {table.dtype!r}, "
                f"this runner uses {self.kv_cache_dtype!r}"
            )
        self._kv_scales = table
        self._prefix_root = root_key(table, str(self.kv_torch_dtype))
        if is_fp8(self.kv_torch_dtype):
            self._step_scales = (table.k_scale, table.v_scale)
        else:  # non-FP8 caches ignore scales; keep the attention math exact
            self._step_scales = ((1.0,) * self.num_layers, (1.0,) * self.num_layers)

    # ---- sequences -------------------------------------------------------------------------

    def open(self, seq_id: str) -> None:
        """Start an empty sequence. ValueError if it is already open."""
        self.cache.open(seq_id)
        self._seq_tables[seq_id] = self._kv_scales
        if self._prefix is not None:
            self._prefix.open(seq_id)

    def has(self, seq_id: str) -> bool:
        return self.cache.has(seq_id)

    def seq_len(self, seq_id: str) -> int:
        """Tokens cached for the sequence. KeyError if it is not open."""
        return self.cache.seq_len(seq_id)

    def truncate(self, seq_id: str, length: int) -> None:
        """Drop the sequence's tokens past ``length`` (e.g. rejected proposals).

        OutOfPagesError, and no change, in the one case that takes a page: a cut into a
        cached block another sequence holds too gets a private copy of it.
        """
        self.cache.truncate(seq_id, length)
        if self._prefix is not None:
            self._prefix.truncate(seq_id, length)

    def release(self, seq_id: str) -> None:
        """Close the sequence and free its pages. KeyError if it is not open."""
        self.cache.free(seq_id)
        del self._seq_tables[seq_id]
        if self._prefix is not None:
            self._prefix.release(seq_id)

    # ---- the step --------------------------------------------------------------------------

    def extend(self, chunks: list[SequenceChunk]) -> list[torch.Tensor]:
        """Append every chunk's tokens to its sequence in one forward; return its logits.

        Returns, per chunk in order, float32 logits ``[chunk.num_logits, vocab]`` for the
        chunk's last ``num_logits`` tokens. All-or-nothing: on any error no sequence
        changes. Raises KeyError (sequence not open), ValueError (sequence twice in one
        call, or past ``max_model_len``), ``OutOfPagesError`` (cache full),
        ``KVScalesMismatchError`` (sequence written under an older KV-scale table).

        Afterwards ``last_prefix_hits`` holds, per sequence extended, how many leading
        tokens of its chunk came from the prefix cache (none computed; {} with it off).
        """
        return [out.logits for out in self.forward_chunks(chunks)]

    @torch.inference_mode()
    def forward_chunks(self, chunks: list[SequenceChunk]) -> list[ChunkOutput]:
        """``extend``, also returning each chunk's final hidden states at its last
        ``num_hidden`` tokens, of those computed (a prefix-cache hit computes fewer)."""
        self._validate(chunks)
        seq_ids = [c.seq_id for c in chunks if c.token_ids]
        old_lens = [self.cache.seq_len(s) for s in seq_ids]
        try:
            matched = self._take_cached_prefixes(chunks)
            active = [_skip(c, matched) for c in chunks if c.token_ids]
            query_lens = [len(c.token_ids) for c in active]
            if active:
                self.cache.reserve(seq_ids, query_lens)
            start = time.perf_counter()
            logits, hidden = self._forward(active, seq_ids, query_lens) if active else (None, None)
        except BaseException:
            self._truncate_to(seq_ids, old_lens)
            raise
        self.forward_seconds += time.perf_counter() - start
        self._record(active)
        self.last_prefix_hits = {seq_id: hit for seq_id, (_, hit) in matched.items()}
        self.prefix_cache_queries += sum(queried for queried, _ in matched.values())
        self.prefix_cache_hits += sum(self.last_prefix_hits.values())
        empty = torch.empty(0, self.vocab_size, dtype=torch.float32, device=self.device)
        no_hidden = torch.empty(0, self.model_config.hidden_size, device=self.device)
        by_seq = {c.seq_id: c for c in active}
        results: list[ChunkOutput] = []
        logit_offset = hidden_offset = 0
        for chunk in chunks:
            rows = empty
            if chunk.num_logits:
                rows = logits[logit_offset : logit_offset + chunk.num_logits]
                logit_offset += chunk.num_logits
            num_hidden = _hidden_rows(by_seq.get(chunk.seq_id))
            states = no_hidden
            if num_hidden:
                states = hidden[hidden_offset : hidden_offset + num_hidden]
                hidden_offset += num_hidden
            results.append(ChunkOutput(rows, states))
        return results

    @torch.inference_mode()
    def decode_greedy(
        self,
        seq_ids: list[str],
        tokens: list[int],
        steps: int,
        min_prob: float = 0.0,
        min_prob_from: int = 0,
        stop: torch.Tensor | None = None,
    ) -> list[list[int]] | None:
        """Greedy decoding with no Python between forwards: each sequence feeds its token
        of ``tokens``, then the argmax of its logits, ``steps`` times, in one C call
        (``DecoderLayers.greedy``: the kernels ``extend`` runs, so the tokens ``extend``
        and argmax would pick). Returns each sequence's picks: ``steps`` of them, or fewer
        where one's probability fell below ``min_prob`` (the picks before it; the first
        ``min_prob_from`` picks are kept whatever their probability); a sequence
        then holds as many more tokens as it has picks (its token, then every pick but the
        last; ``num_computed_tokens`` counts those). None, with nothing changed, where the
        C loop does not apply (PyTorch path, FP8 KV cache, reference attention). ``stop``: an
        int32 [1] flag another thread may set to end the loop before its next forward, each
        sequence keeping the picks made so far. Errors as ``extend``'s, all-or-nothing."""
        if not self.decodes_greedy_in_c or steps < 1:
            return None
        layers, head = self.model.model.native_layers, self.model.greedy_head()
        self._validate(
            [SequenceChunk(s, [t] * steps, 0) for s, t in zip(seq_ids, tokens, strict=True)]
        )
        old_lens = [self.cache.seq_len(s) for s in seq_ids]
        self.cache.reserve(seq_ids, [steps] * len(seq_ids))
        start = time.perf_counter()
        try:
            picked = self._greedy_forward(
                layers, head, seq_ids, tokens, steps, old_lens, (min_prob, min_prob_from), stop
            )
        except BaseException:
            self._truncate_to(seq_ids, old_lens)
            raise
        self.forward_seconds += time.perf_counter() - start
        picks, counts = picked[0].t().tolist(), picked[1].tolist()
        self._truncate_to(seq_ids, [n + c for n, c in zip(old_lens, counts, strict=True)])
        rows = zip(seq_ids, tokens, picks, counts, strict=True)
        # A sequence holds its token, then every pick but the last, as many as it keeps.
        self._record([SequenceChunk(s, [t, *row][:c], 0) for s, t, row, c in rows])
        return [row[:c] for row, c in zip(picks, counts, strict=True)]

    def greedy_picks(
        self,
        seq_ids: list[str],
        tokens: list[int],
        steps: int,
        min_prob: float = 0.0,
        min_prob_from: int = 0,
        features: torch.Tensor | None = None,
    ) -> list[list[int]]:
        """``decode_greedy``'s picks, from its C loop where it runs, else forward by forward
        (``extend`` and argmax: the same tokens, and the sequences hold the same ones
        after). Callers need not know which ran. ``features`` ``[len(seq_ids), hidden]``:
        for a model that reads the target's features, those of each sequence's token; each
        pick after it then reads the hidden state its forward left."""
        picked = self.decode_greedy(seq_ids, tokens, steps, min_prob, min_prob_from)
        if picked is not None:
            return picked
        reads = self.model_config.reads_target_features
        old_lens = [self.cache.seq_len(s) for s in seq_ids]
        picks: list[list[int]] = [[] for _ in seq_ids]
        active, feed = list(range(len(seq_ids))), list(tokens)
        fed_features = [None if features is None else features[i : i + 1] for i in active]
        try:
            for step in range(steps):
                chunks = [
                    SequenceChunk(seq_ids[i], [feed[i]], 1, int(reads), fed_features[i])
                    for i in active
                ]
                still = []
                for i, out in zip(active, self.forward_chunks(chunks), strict=True):
                    logits = out.logits
                    fed_features[i] = out.hidden if reads else None
                    token = int(logits[-1].argmax())
                    if step >= min_prob_from and min_prob > 0:
                        prob = float(torch.softmax(logits[-1].float(), -1)[token])
                        if prob < min_prob:
                            continue  # ends here, keeping the picks before
                    picks[i].append(token)
                    feed[i] = token
                    still.append(i)
                active = still
        except BaseException:
            self._truncate_to(seq_ids, old_lens)
            raise
        # As the C loop leaves them: its token, then every pick but the last.
        self._truncate_to(seq_ids, [n + len(p) for n, p in zip(old_lens, picks, strict=True)])
        return picks

    def _truncate_to(self, seq_ids: list[str], lengths: list[int]) -> None:
        for seq_id, length in zip(seq_ids, lengths, strict=True):
            self.truncate(seq_id, length)

    def _take_cached_prefixes(self, chunks: list[SequenceChunk]) -> dict[str, tuple[int, int]]:
        """Attaches each chunk's cached leading blocks (``PrefixCache.match``); per
        sequence, (tokens looked up, tokens attached). Empty with prefix caching off."""
        if self._prefix is None:
            return {}
        return {c.seq_id: self._prefix.match(c, self._prefix_root) for c in chunks if c.token_ids}

    def _record(self, chunks: list[SequenceChunk]) -> None:
        """After a step: the chunks' tokens are computed under the current table, and the
        blocks they complete are published."""
        for chunk in chunks:
            self._seq_tables[chunk.seq_id] = self._kv_scales
            self.num_computed_tokens += len(chunk.token_ids)
            if self._prefix is not None:
                self._prefix.record(chunk.seq_id, chunk.token_ids, self._prefix_root)

    def _greedy_forward(
        self, layers, head, seq_ids, tokens, steps, old_lens, cut: tuple[float, int], stop
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = len(seq_ids)
        meta = build_attention_metadata(self.cache, seq_ids, [steps] * batch)

        def by_forward(t: torch.Tensor) -> torch.Tensor:  # per sequence -> per forward
            return t.view(batch, steps).t().contiguous()

        rope = self.model.model.rotary_emb.for_step(meta.positions, torch.float32, in_kernel=True)
        rows = self.cache.slot_rows(by_forward(meta.slot_mapping).flatten())
        n = batch * steps
        kv_rows = torch.cat([rows.rows[:n].view(steps, batch), rows.rows[n:].view(steps, batch)], 1)
        kv_lens = torch.tensor(old_lens).unsqueeze(0) + torch.arange(1, steps + 1).unsqueeze(1)
        step = NativeStep(
            kv_layers=self.cache.layer_pointers,
            kv_rows=kv_rows.contiguous(),
            qo_indptr=torch.arange(batch + 1),
            kv_lens=kv_lens.contiguous(),
            page_indptr=meta.kv_indptr.to(torch.int64),
            page_indices=meta.kv_indices.to(torch.int64),
            page_size=meta.page_size,
            sm_scale=self._sm_scale,
        )
        first = torch.tensor(tokens, dtype=torch.int64)
        return layers.greedy(
            first, by_forward(meta.positions), rope.cos, rope.sin_signed, step, head, *cut, stop
        )

    def _validate(self, chunks: list[SequenceChunk]) -> None:
        seen: set[str] = set()
        fp8 = is_fp8(self.kv_torch_dtype)
        for chunk in chunks:
            seq_id = chunk.seq_id
            if seq_id in seen:
                raise ValueError(f"sequence {seq_id!r} appears twice in one extend call")
            seen.add(seq_id)
            new_len = self.cache.seq_len(seq_id) + len(chunk.token_ids)  # KeyError if unknown
            if new_len > self.max_model_len:
                raise ValueError(
                    f"sequence {seq_id!r} would hold {new_len} tokens, more than "
                    f"max_model_len={self.max_model_len}"
                )
            if (
                fp8
                and self._seq_tables[seq_id] != self._kv_scales
                and self.cache.seq_len(seq_id) > 0
            ):
                raise KVScalesMismatchError(
                    f"sequence {seq_id!r} was written under KV-scale table version "
                    f"{self._seq_tables[seq_id].version}, the runner now uses version "
                    f"{self._kv_scales.version}; release it and rebuild it from its tokens"
                )

    def _forward(
        self, chunks: list[SequenceChunk], seq_ids: list[str], query_lens: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        mc = self.model_config
        meta = build_attention_metadata(self.cache, seq_ids, query_lens)
        self.backend.plan(
            meta,
            mc.num_heads,
            mc.num_kv_heads,
            mc.head_dim,
            self.config.compute_dtype,
            self.kv_torch_dtype,
        )
        k_scales, v_scales = self._step_scales
        ctx = PagedContext(
            positions=meta.positions,
            write_rows=self.cache.slot_rows(meta.slot_mapping),
            cache=self.cache,
            backend=self.backend,
            k_scales=k_scales,
            v_scales=v_scales,
            sm_scale=self._sm_scale,
        )
        flat = list(itertools.chain.from_iterable(c.token_ids for c in chunks))
        input_ids = torch.tensor(flat, dtype=torch.int64, device=self.device)
        hidden = self.model(input_ids, ctx, self._features(chunks))
        rows: list[int] = []
        hidden_rows: list[int] = []
        end = 0
        for chunk, n in zip(chunks, query_lens, strict=True):
            end += n
            rows.extend(range(end - chunk.num_logits, end))
            hidden_rows.extend(range(end - _hidden_rows(chunk), end))
        states = None  # most steps ask for none: no copy for them
        if hidden_rows:
            rows_index = torch.tensor(hidden_rows, dtype=torch.int64, device=self.device)
            states = hidden.index_select(0, rows_index)
        if not rows:
            return hidden.new_empty(0, self.vocab_size, dtype=torch.float32), states
        index = torch.tensor(rows, dtype=torch.int64, device=self.device)
        return self.model.compute_logits(hidden.index_select(0, index)), states

    def _features(self, chunks: list[SequenceChunk]) -> torch.Tensor | None:
        """The chunks' target features in one ``[T, hidden]`` tensor (zeros where a chunk
        has none), for a model that reads them; else None."""
        if not self.model_config.reads_target_features:
            return None
        size = self.model_config.hidden_size
        parts = [
            torch.zeros(len(c.token_ids), size) if c.features is None else c.features.float()
            for c in chunks
        ]
        return torch.cat(parts).to(self.device)


@dataclass(frozen=True)
class ChunkOutput:
    """One chunk's part of a forward: float32 logits ``[num_logits, vocab]`` and final
    hidden states ``[num_hidden, hidden]`` (after the last norm)."""

    logits: torch.Tensor
    hidden: torch.Tensor


def _hidden_rows(chunk: SequenceChunk | None) -> int:
    """Hidden rows a (computed part of a) chunk returns."""
    return 0 if chunk is None else min(chunk.num_hidden, len(chunk.token_ids))


def _skip(chunk: SequenceChunk, matched: dict[str, tuple[int, int]]) -> SequenceChunk:
    """The chunk less its tokens whose KV the prefix cache attached."""
    _, hit = matched.get(chunk.seq_id, (0, 0))
    if not hit:
        return chunk
    rest = chunk.token_ids[hit:]
    features = None if chunk.features is None else chunk.features[hit:]
    return replace(
        chunk, token_ids=rest, num_hidden=min(chunk.num_hidden, len(rest)), features=features
    )
