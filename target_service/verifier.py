"""The target model's side of a step: prefill chunks and verify proposals, one forward.

Plain domain code (no gRPC): the servicer turns messages into the dataclasses of
``target_service.steps`` and back.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from specdec.kernels.paged_kv_cache import OutOfPagesError
from specdec.kernels.random_stream import SAMPLE_DRAW, TARGET_DOMAIN, RandomStream
from specdec.kernels.sampling import TokenLogprobs, sample_token, token_logprobs
from specdec.kernels.verify import chain_speculative_sampling, verify_greedy
from specdec.runtime.errors import InvalidRequestError, OutOfSyncError, UnknownRequestError
from specdec.runtime.grammar import Grammars, GrammarTokenizer
from specdec.runtime.model_runner import ChunkOutput, ModelRunner
from specdec.runtime.sampling import Sampling
from specdec.runtime.sequence import SequenceChunk
from specdec.runtime.structured_output import GrammarError
from specdec.target_service.steps import (
    PrefillChunk,
    VerifyEntry,
    VerifyResult,
    check_draft_probs,
)

logger = logging.getLogger(__name__)


class Verifier:
    """Runs prefill chunks and verify entries of a step in ONE ``extend``.

    Invariants: a refused or failed step, or entry, changes no sequence; after a verify the
    target holds ``start_position + 1 + num_accepted`` tokens (rejected positions are
    dropped).
    """

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        # Per held sequence: its draws, keyed by (seed or fresh entropy, position), so the
        # target's acceptance tests never share a stream with the draft's proposals.
        self._streams: dict[str, RandomStream] = {}
        self._history: dict[str, list[int]] = {}  # the tokens held, from position 0
        # prompt_logprobs: a prefill chunk's last logits row, which scores the next chunk's
        # first token.
        self._last_prompt_row: dict[str, torch.Tensor] = {}
        self._grammars = Grammars(
            GrammarTokenizer(runner.config.model, runner.vocab_size, runner.eos_token_ids)
        )
        self._prefilled: set[str] = set()  # sequences whose last prefill chunk has run
        self.num_steps = 0
        # Multi-step bursts: the one running (named by its caller and step id), the last
        # one asked to end, and the flag that ends it before its next forward.
        self._burst: object | None = None
        self._end_asked: object | None = None
        self._burst_stop = torch.zeros(1, dtype=torch.int32)

    @property
    def num_sequences(self) -> int:
        return len(self._streams)

    def release(self, request_ids: list[str]) -> int:
        """Drop the requests' sequences (ids not held are ignored); returns how many."""
        released = 0
        for rid in dict.fromkeys(request_ids):
            if self._streams.pop(rid, None) is not None:
                self._prefilled.discard(rid)
                self._history.pop(rid, None)
                self._last_prompt_row.pop(rid, None)
                self._grammars.release(rid)
                self.runner.release(rid)
                released += 1
        return released

    def end_burst(self, burst: object) -> bool:
        """Ends the multi-step burst ``burst`` names before its next forward (one that has
        not started yet stops after its first). Safe from any thread. False when it is not
        running now."""
        self._end_asked = burst
        if self._burst == burst:
            self._burst_stop[0] = 1
            return True
        return False

    def verify(
        self,
        prefill: list[PrefillChunk],
        decode: list[VerifyEntry],
        failed: dict[str, Exception] | None = None,
        num_steps: int = 1,
        burst: object = None,
        return_features: bool = False,
    ) -> list[VerifyResult]:
        """Runs the step's entries in one forward. An entry that is bad on its own (or whose
        sampling fails) fails alone: its result carries the error, its sequence is as before
        the step, and the others go on. ``failed``: entries the caller already refused
        (e.g. unparsable sampling parameters), reported the same way. ``num_steps`` > 1:
        see ``decode_steps``; ``burst`` names it for ``end_burst``. ``return_features``:
        each result carries the final hidden states of the positions it kept."""
        if num_steps > 1:
            if prefill:
                raise InvalidRequestError("num_steps > 1 takes no prefill chunks")
            self._burst = burst
            self._burst_stop[0] = int(burst is not None and self._end_asked == burst)
            try:
                return self.decode_steps(decode, num_steps, failed, return_features)
            finally:
                self._burst = None
                self._burst_stop[0] = 0
        failed = dict(failed or {})
        self._check_ids([c.request_id for c in prefill] + [e.request_id for e in decode], failed)
        prefill = [c for c in prefill if _passes(self._check_chunk, c, failed)]
        decode = [e for e in decode if _passes(self._check_entry, e, failed)]
        opened = [c for c in prefill if c.request_id not in self._streams]
        for c in opened:
            self.runner.open(c.request_id)
            self._streams[c.request_id] = c.sampling.random_stream(TARGET_DOMAIN)
            self._history[c.request_id] = []
        chunks = [
            SequenceChunk(c.request_id, list(c.token_ids), c.num_logits,
                          len(c.token_ids) if return_features else 0)
            for c in prefill
        ]  # fmt: skip
        chunks += [
            SequenceChunk(e.request_id, [e.last_token_id, *e.proposal_ids],
                          len(e.proposal_ids) + 1, (len(e.proposal_ids) + 1) * return_features)
            for e in decode
        ]  # fmt: skip
        try:
            logits = self.runner.forward_chunks(chunks)
        except BaseException:
            self.release([c.request_id for c in opened])  # extend changed nothing else
            raise
        results = []
        for c, out in zip(prefill, logits, strict=False):
            try:
                results.append(self._emit_first(c, out))
                if c.is_last:
                    self._prefilled.add(c.request_id)
            except Exception as e:
                self._undo(c.request_id, c.start_position, opened=c in opened)
                failed[c.request_id] = e
        for entry, out in zip(decode, logits[len(prefill) :], strict=True):
            try:
                results.append(self._accept(entry, out))
            except Exception as e:
                self._undo(entry.request_id, entry.start_position, opened=False)
                failed[entry.request_id] = e
        self.num_steps += 1
        return results + [
            VerifyResult(rid, [], 0, self._held(rid), error=e) for rid, e in failed.items()
        ]

    def decode_steps(
        self,
        decode: list[VerifyEntry],
        num_steps: int,
        failed: dict[str, Exception] | None = None,
        return_features: bool = False,
    ) -> list[VerifyResult]:
        """Multi-step decoding: up to ``num_steps`` K = 0 steps back to back, each feeding
        every entry the token it emitted last, so one request does the work of several.

        A greedy batch runs every step in one C call (``_greedy_decode``), its entries
        checked as ``verify`` checks them; otherwise the first step is ``verify``'s, errors
        included. An entry leaves the batch after
        ``max_new_tokens`` tokens or a stop token; a later step that fails (the cache is
        full, or the entry now is bad) ends the entries it would have extended where they
        are, and the next request reports the error. Each token is drawn exactly as one
        step would draw it (same position, same random stream), so the output does not
        depend on ``num_steps``; each result lists every token its entry emitted. A burst
        ``end_burst`` ends stops before its next forward, each entry keeping what it emitted.
        ``return_features``: as ``verify``'s, over every step (never the C loop, which
        returns no hidden states).
        """
        if any(e.proposal_ids for e in decode):
            raise InvalidRequestError(
                "num_steps > 1 runs decode entries without proposals only (K = 0)"
            )
        plain = all(e.sampling.greedy and not e.sampling.needs_logits for e in decode)
        if decode and plain and not return_features:
            greedy = self._greedy_decode(decode, num_steps, failed)
            if greedy is not None:
                return greedy
        results = {
            r.request_id: r
            for r in self.verify([], decode, failed, return_features=return_features)
        }
        live = [e for e in decode if results[e.request_id].error is None]
        live = [e for e in live if not self._stops(e, results[e.request_id].token_ids)]
        for done in range(1, num_steps):
            if not live or self._burst_stop[0]:
                break
            step = [
                replace(
                    e,
                    start_position=results[e.request_id].num_cached_tokens,
                    last_token_id=results[e.request_id].token_ids[-1],
                )
                for e in live
            ]
            try:
                sub = self.verify([], step, return_features=return_features)
            except Exception as e:  # nothing of this step was kept; the next request reports it
                logger.warning(
                    "multi-step decoding stopped after %d of %d steps: %r", done, num_steps, e
                )
                break
            for r in sub:
                if r.error is not None:
                    live = [e for e in live if e.request_id != r.request_id]
                    continue
                before = results[r.request_id]
                results[r.request_id] = replace(
                    before,
                    token_ids=before.token_ids + r.token_ids,
                    num_cached_tokens=r.num_cached_tokens,
                    features=_joined(before.features, r.features),
                    logprobs=None if r.logprobs is None else before.logprobs + r.logprobs,
                )
            live = [e for e in live if not self._stops(e, results[e.request_id].token_ids)]
        return list(results.values())

    def _greedy_decode(
        self, decode: list[VerifyEntry], num_steps: int, failed: dict[str, Exception] | None
    ) -> list[VerifyResult] | None:
        """Every step in one C call (``ModelRunner.decode_greedy``) for greedy entries,
        checked as ``verify`` checks them; each entry then keeps its tokens up to its stop
        or budget and drops the KV past them. None (nothing done) where the C loop does not
        apply or the cache cannot hold every step at once: the caller steps instead."""
        failed = dict(failed or {})
        self._check_ids([e.request_id for e in decode], failed)
        live = [e for e in decode if _passes(self._check_entry, e, failed)]
        budget = {e.request_id: min(e.max_new_tokens or num_steps, num_steps) for e in live}
        steps = max(budget.values(), default=0)
        if any(e.start_position + steps > self.runner.max_model_len for e in live):
            return None  # every entry runs every step: one would pass its end
        results = []
        if live:
            ids = [e.request_id for e in live]
            try:
                last = [e.last_token_id for e in live]
                picks = self.runner.decode_greedy(ids, last, steps, stop=self._burst_stop)
            except OutOfPagesError:
                return None
            if picks is None:
                return None
            self.num_steps += steps
            for e, picked in zip(live, picks, strict=True):
                emitted = picked[: budget[e.request_id]]
                keep = next(
                    (n for n, t in enumerate(emitted, 1) if t in e.stop_token_ids), len(emitted)
                )
                held = e.start_position + keep  # the fed token and every kept one but the last
                self.runner.truncate(e.request_id, held)
                self._history[e.request_id] += [e.last_token_id, *emitted[: keep - 1]]
                results.append(VerifyResult(e.request_id, emitted[:keep], 0, held))
        return results + [
            VerifyResult(rid, [], 0, self._held(rid), error=e) for rid, e in failed.items()
        ]

    @staticmethod
    def _stops(e: VerifyEntry, emitted: list[int]) -> bool:
        return emitted[-1] in e.stop_token_ids or len(emitted) >= (e.max_new_tokens or 1 << 30)

    def _undo(self, rid: str, held_before: int, opened: bool) -> None:
        if opened:
            self.release([rid])
        else:
            self.runner.truncate(rid, held_before)
            del self._history[rid][held_before:]

    # ---- validation (no state changes) -----------------------------------------------------

    def _check_ids(self, request_ids: list[str], failed: dict[str, Exception]) -> None:
        """Whole-step errors: a step that names a request twice (or none) is malformed."""
        seen = set(failed)
        for rid in request_ids:
            if not rid:
                raise InvalidRequestError("request_id must not be empty")
            if rid in seen:
                raise InvalidRequestError(f"request {rid} appears twice in one verify step")
            seen.add(rid)

    def _check_chunk(self, c: PrefillChunk) -> None:
        rid, max_len = c.request_id, self.runner.max_model_len
        held = self._held(rid)
        if rid in self._prefilled:
            raise OutOfSyncError(
                f"request {rid}: its prompt was already prefilled (a chunk with is_last "
                f"ran); send verify entries, not prefill chunks"
            )
        if c.start_position != held:
            raise OutOfSyncError(
                f"request {rid}: prefill chunk starts at {c.start_position} but the target "
                f"holds {held} tokens"
            )
        if c.is_last and not c.token_ids:
            raise InvalidRequestError(f"request {rid}: the last prefill chunk is empty")
        self._check_tokens(rid, c.token_ids)
        self._check_sampling(rid, c.sampling)
        if held + len(c.token_ids) > max_len:
            raise InvalidRequestError(
                f"request {rid}: {held + len(c.token_ids)} tokens exceed max_model_len={max_len}"
            )

    def _check_entry(self, e: VerifyEntry) -> None:
        rid, max_len = e.request_id, self.runner.max_model_len
        if rid not in self._streams:
            raise UnknownRequestError(f"request {rid}: the target holds no sequence for it")
        if rid not in self._prefilled:
            raise OutOfSyncError(
                f"request {rid}: verify before its prefill finished (no chunk with is_last has run)"
            )
        held = self.runner.seq_len(rid)
        if e.start_position != held:
            raise OutOfSyncError(
                f"request {rid}: verify starts at {e.start_position} but the target holds "
                f"{held} tokens"
            )
        k = len(e.proposal_ids)
        self._check_tokens(rid, (e.last_token_id, *e.proposal_ids))
        self._check_sampling(rid, e.sampling)
        if held + 1 + k > max_len:
            raise InvalidRequestError(
                f"request {rid}: {held} tokens + 1 + K={k} exceed max_model_len={max_len}"
            )
        got = 0 if e.draft_probs is None else len(e.draft_probs)
        if not e.sampling.greedy and k and got != k:
            raise InvalidRequestError(
                f"request {rid}: draft_probs holds {got} distributions, expected one per "
                f"proposal (K = {k})"
            )
        if not e.sampling.greedy and k:
            check_draft_probs(rid, e.draft_probs, e.proposal_ids, self.runner.vocab_size)

    def _held(self, rid: str) -> int:
        return self.runner.seq_len(rid) if rid in self._streams else 0

    def _check_tokens(self, rid: str, token_ids: tuple[int, ...]) -> None:
        vocab = self.runner.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(
                f"request {rid}: token id {bad[0]} is out of range (vocab size {vocab})"
            )

    def _check_sampling(self, rid: str, sampling: Sampling) -> None:
        bad = sampling.id_out_of_range(self.runner.vocab_size)
        if bad is not None:
            raise InvalidRequestError(
                f"request {rid}: logit_bias or min_tokens_stop_ids names token id {bad}, "
                f"out of range (vocab size {self.runner.vocab_size})"
            )

    # ---- results ---------------------------------------------------------------------------

    def _emit_first(self, c: PrefillChunk, out: ChunkOutput) -> VerifyResult:
        history = self._history[c.request_id]
        history += c.token_ids
        tokens: list[int] = []
        logprobs = None
        if c.emits:
            raw = out.logits[-1:]
            allowed = self._allowed(c.request_id, c.sampling, history, (), 1)
            logits = c.sampling.processed(raw, history, (), allowed)
            if c.sampling.greedy:
                tokens = [int(logits[-1].argmax())]
            else:
                position = c.start_position + len(c.token_ids)  # of the token sampled here
                u = self._streams[c.request_id].uniform(position, SAMPLE_DRAW)
                tokens = [sample_token(c.sampling.probs(logits)[0], u)]
            if c.sampling.logprobs is not None:
                logprobs = token_logprobs(raw, tokens, c.sampling.logprobs)
        prompt_logprobs, prompt_start = self._prompt_logprobs(c, out.logits)
        rid, hits = c.request_id, self.runner.last_prefix_hits.get(c.request_id, 0)
        held = self.runner.seq_len(rid)
        features = out.hidden if out.hidden.numel() else None
        start = held - (0 if features is None else features.shape[0])
        return VerifyResult(rid, tokens, 0, held, num_prefix_cached_tokens=hits,
                            features=features, feature_start=start, logprobs=logprobs,
                            prompt_logprobs=prompt_logprobs,
                            prompt_logprobs_start=prompt_start)  # fmt: skip

    def _prompt_logprobs(
        self, c: PrefillChunk, logits: torch.Tensor
    ) -> tuple[list[TokenLogprobs] | None, int]:
        """The chunk's tokens' logprobs (its rows score the tokens after them; the chunk
        before's last row its first token) and the position they start at."""
        if c.sampling.prompt_logprobs is None:
            return None, 0
        rid, num = c.request_id, c.sampling.prompt_logprobs
        rows = logits[: len(c.token_ids)]  # the last scores the token after the chunk
        before = self._last_prompt_row.pop(rid, None)
        tokens = list(c.token_ids)
        if before is not None:
            rows = torch.cat([before[None], rows])
        else:
            tokens = tokens[1:]  # the first token of the sequence has no logprob
        if not c.is_last:
            self._last_prompt_row[rid] = rows[-1]
        start = c.start_position + len(c.token_ids) - len(tokens)
        return token_logprobs(rows[:-1], tokens, num), start

    def _allowed(
        self, rid: str, sampling: Sampling, history: list[int], chain: list[int], rows: int
    ) -> torch.Tensor | None:
        """The grammar's masks of the rows after ``history`` and ``chain`` (None: no
        structured output)."""
        if sampling.grammar is None:
            return None
        output = history[sampling.processing.num_prompt_tokens :]
        try:
            return self._grammars.masks(rid, sampling.grammar, output, chain, rows)
        except GrammarError as e:
            raise InvalidRequestError(f"request {rid}: {e}") from None

    def _accept(self, e: VerifyEntry, out: ChunkOutput) -> VerifyResult:
        proposals = list(e.proposal_ids)
        history = self._history[e.request_id]
        logits = out.logits
        if e.sampling.reads_history:
            before = [*history, e.last_token_id]
            allowed = self._allowed(e.request_id, e.sampling, before, proposals, len(proposals) + 1)
            logits = e.sampling.processed(logits, before, proposals, allowed)
        if e.sampling.greedy:
            emitted, accepted = verify_greedy(logits, proposals)
        else:
            vocab = self.runner.vocab_size
            if e.draft_probs is None or not proposals:
                q = logits.new_empty(0, vocab)
            else:
                q = torch.stack([d.dense(vocab) for d in e.draft_probs]).to(logits.device)
            p = e.sampling.probs(logits)
            # Row i decides the token at start_position + 1 + i; K = 0 is a plain sample.
            emitted, accepted = chain_speculative_sampling(
                q, proposals, p, self._streams[e.request_id], e.start_position + 1
            )
        logprobs = None
        if e.sampling.logprobs is not None:
            logprobs = token_logprobs(out.logits[: len(emitted)], emitted, e.sampling.logprobs)
        # Drop the KV of rejected proposals before answering.
        self.runner.truncate(e.request_id, e.start_position + 1 + accepted)
        history += [e.last_token_id, *proposals[:accepted]]
        held = self.runner.seq_len(e.request_id)
        features = out.hidden[: accepted + 1] if out.hidden.numel() else None
        return VerifyResult(e.request_id, emitted, accepted, held, features=features,
                            feature_start=e.start_position, logprobs=logprobs)  # fmt: skip


def _joined(first: torch.Tensor | None, then: torch.Tensor | None) -> torch.Tensor | None:
    return first if then is None else then if first is None else torch.cat([first, then])


def _passes(check, item, failed: dict[str, Exception]) -> bool:
    try:
        check(item)
    except (InvalidRequestError, OutOfSyncError, UnknownRequestError) as e:
        failed[item.request_id] = e
        return False
    return True
