"""The draft model's side of a step: ingest committed tokens, then propose K of its own.

Plain domain code (no gRPC): the servicer turns messages into the dataclasses of
``draft_service.steps`` and back.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from specdec.draft_service.prompt_lookup import TokenHistory, check_ngram
from specdec.draft_service.proposing import Proposing
from specdec.draft_service.steps import (
    DraftStep,
    DraftStepResult,
    IngestPlan,
    Proposal,
    ProposeEntry,
)
from specdec.draft_service.work import HeldSequence, RequestWork
from specdec.kernels.paged_kv_cache import OutOfPagesError
from specdec.runtime.errors import InvalidRequestError, OutOfSyncError, UnknownRequestError
from specdec.runtime.grammar import Grammars, GrammarTokenizer
from specdec.runtime.kv_scales import KVScaleTable
from specdec.runtime.model_runner import ChunkOutput, ModelRunner
from specdec.runtime.sequence import SequenceChunk

RESYNC_HINT = "re-sync from the log (release, then ingest from 0)"


class Drafter(Proposing):
    """Keeps one draft KV cache per request in sync with the committed log; proposes.

    Invariants: for every held request, the runner holds ``num_committed - len(pending) +
    len(tail)`` tokens; a refused step changes nothing; a step feeds and picks in one path
    (``_feed_and_pick``): all its ingests are one ``extend``, the greedy proposers' picks
    one ``ModelRunner.greedy_picks`` (the C loop where it runs, hidden behind the runner),
    and a sampled proposer's each further position one ``extend``.

    ``lazy_ingest``: a request that only ingests this step (K = 0) runs no forward, unless
    its plan is ``eager``; its tokens wait in ``pending`` and go into the ingest forward of
    its next proposal step (a request that finishes first never costs one). Its proposals
    are those of eager ingest.
    A proposal found by prompt lookup is a step of that kind for the model: its tokens wait
    in ``pending`` too (or, eager, are fed with no logits).
    """

    def __init__(self, runner: ModelRunner, lazy_ingest: bool = True) -> None:
        self.runner = runner
        self.lazy_ingest = lazy_ingest
        # An EAGLE-style draft: each token's input joins the target's feature of the
        # position before (IngestPlan.features); its own proposals read its own output.
        self.reads_features = runner.model_config.reads_target_features
        self._seqs: dict[str, HeldSequence] = {}
        self._grammars = Grammars(
            GrammarTokenizer(runner.config.model, runner.vocab_size, runner.eos_token_ids)
        )
        self._tables: dict[int, KVScaleTable] = {runner.kv_scales.version: runner.kv_scales}
        self.num_steps = 0
        self.num_ingest_plans = 0
        self.num_ingested_tokens = 0
        self.num_looked_up = 0  # proposals prompt lookup found (no forward)
        # Forward time in steps with no fresh proposal (ingest only or ahead), which the
        # coordinator runs beside a verify.
        self.ahead_forward_seconds = 0.0

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    @property
    def num_free_pages(self) -> int:
        """The runner's free pages less those its pending tokens (ingested, KV not computed
        yet) will take when computed; at least 0."""
        page_size = self.runner.config.page_size
        promised = 0
        for rid, seq in self._seqs.items():
            held = self.runner.seq_len(rid)
            promised += _cdiv(held + len(seq.pending), page_size) - _cdiv(held, page_size)
        return max(self.runner.num_free_pages - promised, 0)

    def num_committed(self, request_id: str) -> int:
        """Committed tokens held for the request (0 if none)."""
        seq = self._seqs.get(request_id)
        return seq.num_committed if seq else 0

    # ---- the step --------------------------------------------------------------------------

    def step(self, step: DraftStep, failed: dict[str, Exception] | None = None) -> DraftStepResult:
        """``failed``: requests the caller already refused (their entries did not convert);
        they are reported with the ones this step refuses."""
        started, forward_before = time.monotonic(), self.runner.forward_seconds
        failed = dict(failed or {})
        table = self._resolve_table(step)
        work = self._plan(step, table.version, failed)
        self._check_pages(work)
        if table != self.runner.kv_scales:
            try:
                self.runner.set_kv_scales(table)
            except ValueError as e:
                raise InvalidRequestError(f"kv_scales: {e}") from None
        self._tables[table.version] = table
        proposals = self._feed_and_pick(work, table.version)
        proposals = [self._look_up_ahead(work[p.request_id], p) for p in proposals]
        looked_up = [w for w in work.values() if w.looked_up]
        proposals += [Proposal(w.request_id, w.looked_up, None, looked_up=True) for w in looked_up]
        for w in work.values():
            if w.ahead_of and w.argmax_picks and w.num_branches > 1:
                proposals += self._branches(w, started)
        self.num_looked_up += len(looked_up)
        if all(entry.ahead_of for entry in step.propose):
            self.ahead_forward_seconds += self.runner.forward_seconds - forward_before
        self.num_steps += 1
        self.num_ingest_plans += len(step.ingest)
        self.num_ingested_tokens += sum(len(p.token_ids) for p in step.ingest)
        cached = {rid: self._seqs[rid].num_committed for rid in work}
        return DraftStepResult(proposals, cached, failed, self.num_free_pages)

    def release(self, request_ids: list[str]) -> int:
        """Drop the requests' sequences (ids not held are ignored); returns how many."""
        released = 0
        for rid in dict.fromkeys(request_ids):
            self._grammars.release(rid)
            if self._seqs.pop(rid, None) is not None:
                self.runner.release(rid)
                released += 1
        return released

    # ---- validation (no state changes) -----------------------------------------------------

    def _resolve_table(self, step: DraftStep) -> KVScaleTable:
        version = step.kv_scales_version or self.runner.kv_scales.version
        if step.kv_scales is None:
            if version not in self._tables:
                raise OutOfSyncError(
                    f"the draft has no KV-scale table version {version}; send the full table"
                )
            return self._tables[version]
        if step.kv_scales.version != version:
            raise InvalidRequestError(
                f"kv_scales_version is {version} but the kv_scales table is version "
                f"{step.kv_scales.version}"
            )
        known = self._tables.get(version)
        if known is not None and known != step.kv_scales:
            # Replacing a table is harmless until pages were written under it (e.g. the
            # coordinator pinned a table from a file at start); after that, bump the version.
            writers = [
                rid
                for rid, seq in self._seqs.items()
                if seq.kv_version == version and self.runner.seq_len(rid) > 0
            ]
            if writers:
                raise InvalidRequestError(
                    f"KV-scale table version {version} differs from the one request "
                    f"{writers[0]} was written with; a changed table needs a new version"
                )
        return step.kv_scales

    def _plan(
        self, step: DraftStep, version: int, failed: dict[str, Exception]
    ) -> dict[str, RequestWork]:
        """The step's work per request. A request whose plan or entry is bad goes to
        ``failed`` and is left out (nothing of it changes); a malformed step (a request
        named twice in ingest or in propose, or none named) raises."""
        ingest_ids, propose_ids = set(), set()
        for plan in step.ingest:
            _check_id(plan.request_id, ingest_ids, "ingest")
            ingest_ids.add(plan.request_id)
        for entry in step.propose:
            _check_id(entry.request_id, propose_ids, "propose")
            propose_ids.add(entry.request_id)
        work: dict[str, RequestWork] = {}
        for plan in step.ingest:
            if plan.request_id not in failed:
                _attempt(failed, plan.request_id, self._plan_ingest, plan, work)
        for entry in step.propose:
            if entry.request_id not in failed:
                _attempt(failed, entry.request_id, self._plan_propose, entry, work)
        for rid in list(work):
            if rid in failed or not _attempt(failed, rid, self._check_version, rid, version):
                del work[rid]
        for w in work.values():
            if w.num_tokens and not w.ahead_of:
                w.looked_up = self._lookup(w, w.committed)
            self._decide_feed(w)
        return work

    def _plan_ingest(self, plan: IngestPlan, work: dict[str, RequestWork]) -> None:
        rid, vocab, max_len = plan.request_id, self.runner.vocab_size, self.runner.max_model_len
        held = self.num_committed(rid)
        if plan.start_position != held:
            raise OutOfSyncError(
                f"request {rid}: ingest starts at {plan.start_position} but the draft "
                f"holds {held} committed tokens; {RESYNC_HINT}"
            )
        bad = [t for t in plan.token_ids if t >= vocab]
        if bad:
            raise InvalidRequestError(
                f"request {rid}: token id {bad[0]} is out of range (vocab size {vocab})"
            )
        if held + len(plan.token_ids) > max_len:
            raise InvalidRequestError(
                f"request {rid}: {held + len(plan.token_ids)} tokens exceed max_model_len={max_len}"
            )
        work[rid] = RequestWork(
            rid,
            plan.token_ids,
            opens=rid not in self._seqs,
            eager=plan.eager,
            committed_features=self._rows(plan.features, len(plan.token_ids)),
        )

    def _plan_propose(self, entry: ProposeEntry, work: dict[str, RequestWork]) -> None:
        rid, max_len = entry.request_id, self.runner.max_model_len
        if entry.num_tokens <= 0:
            raise InvalidRequestError(f"request {rid}: num_tokens must be > 0")
        if rid not in self._seqs and rid not in work:
            raise UnknownRequestError(
                f"request {rid}: the draft holds no sequence for it; ingest it from 0"
            )
        w = work.get(rid, RequestWork(rid))
        length = self.num_committed(rid) + len(w.committed)
        if length == 0:
            raise OutOfSyncError(f"request {rid}: cannot propose before any token is ingested")
        ahead = len(entry.ahead_of) + 1 if entry.ahead_of else 0
        if length + ahead + entry.num_tokens > max_len:
            raise InvalidRequestError(
                f"request {rid}: {length} tokens + {ahead} ahead + K={entry.num_tokens} "
                f"exceed max_model_len={max_len}"
            )
        if entry.ahead_of and self.reads_features:
            raise InvalidRequestError(
                f"request {rid}: ahead_of (pipelining) needs the target's features of the "
                f"ahead tokens, which this draft reads; propose after the committed log"
            )
        bad = [t for t in entry.ahead_of if t >= self.runner.vocab_size]
        if bad:
            raise InvalidRequestError(f"request {rid}: ahead_of holds out-of-range id {bad[0]}")
        bad_id = entry.sampling.id_out_of_range(self.runner.vocab_size)
        if bad_id is not None:
            raise InvalidRequestError(f"request {rid}: sampling names out-of-range id {bad_id}")
        if not 0.0 <= entry.min_prob < 1.0:
            raise InvalidRequestError(f"request {rid}: min_prob must be in [0, 1)")
        bad_ngram = check_ngram(entry.prompt_lookup)
        if bad_ngram:
            raise InvalidRequestError(f"request {rid}: {bad_ngram}")
        if entry.num_branches < 0:
            raise InvalidRequestError(f"request {rid}: num_branches must be >= 0")
        w.num_tokens, w.sampling, w.ahead_of = entry.num_tokens, entry.sampling, entry.ahead_of
        w.min_prob, w.prompt_lookup = entry.min_prob, entry.prompt_lookup
        w.num_branches, w.branch_budget_s = entry.num_branches, entry.branch_budget_s
        work[rid] = w

    def _check_version(self, rid: str, version: int) -> None:
        seq = self._seqs.get(rid)
        if seq is not None and seq.kv_version != version and self.runner.seq_len(rid) > 0:
            raise OutOfSyncError(
                f"request {rid}: the draft's KV was written under KV-scale table version "
                f"{seq.kv_version} but this step uses version {version}; {RESYNC_HINT}"
            )

    def _lookup(self, w: RequestWork, extra: tuple[int, ...]) -> list[int]:
        """Prompt lookup's proposals after the request's history and ``extra``; [] where
        it found none, is off, or the request samples."""
        if not w.sampling.greedy or not any(w.prompt_lookup):
            return []
        seq = self._seqs.get(w.request_id)
        history = seq.history if seq else TokenHistory()
        return history.propose(extra, w.prompt_lookup, w.num_tokens)

    def _look_up_ahead(self, w: RequestWork, p: Proposal) -> Proposal:
        """An ahead proposal is, like any, prompt lookup's where it finds one after
        ahead_of and the guess (the model's forwards then served only the guess)."""
        looked = self._lookup(w, (*w.ahead_of, p.guessed_token_id)) if w.ahead_of else []
        return replace(p, token_ids=looked, looked_up=True) if looked else p

    def _decide_feed(self, w: RequestWork) -> None:
        """Keep the speculative tail's prefix that matches the newly committed tokens (and
        the ahead_of tokens after them); feed the pending, new committed and ahead_of tokens
        now, or (lazy, K = 0) leave them pending."""
        seq = self._seqs.get(w.request_id)
        held, tail, pending = (seq.num_committed, seq.tail, seq.pending) if seq else (0, [], [])
        expected = [*w.committed, *w.ahead_of]
        matched = 0
        # A feature-reading draft fed its tail with its own predicted features: the
        # committed part is fed again with the target's.
        while (
            not self.reads_features
            and matched < min(len(tail), len(expected))
            and tail[matched] == expected[matched]
        ):
            matched += 1
        if matched == len(expected) and w.ahead_of:
            matched -= 1  # the guess needs the logits at the last ahead_of token: feed it
        w.keep = held - len(pending) + matched
        unfed = [*pending, *expected[matched:]]
        unfed_features = None
        if self.reads_features:
            pending_rows = seq.pending_features if seq else None
            committed_rows = self._rows(w.committed_features, len(w.committed))
            unfed_features = torch.cat([self._rows(pending_rows, len(pending)), committed_rows])
        if self.lazy_ingest and not w.num_picks and not w.eager:
            w.pending, w.pending_features = unfed, unfed_features
            return
        w.feed, w.feed_features = unfed, unfed_features
        if w.num_picks and not w.feed:
            # Nothing new to feed, yet the first proposal needs the logits at the last
            # committed token: drop it from the KV and feed it again.
            w.keep -= 1
            w.feed = [w.committed[-1] if w.committed else seq.last_token]
            if self.reads_features:
                w.feed_features = seq.last_feature[None]

    def _rows(self, features: torch.Tensor | None, n: int) -> torch.Tensor | None:
        """A feature-reading draft's ``n`` feature rows: ``features``, or zeros where the
        target's are not known; None for any other draft."""
        if not self.reads_features:
            return None
        if features is None:
            return torch.zeros(n, self.runner.model_config.hidden_size)
        return features

    def _check_pages(self, work: dict[str, RequestWork]) -> None:
        page_size = self.runner.config.page_size
        needed = 0
        for rid, w in work.items():
            now = self.runner.seq_len(rid) if rid in self._seqs else 0
            peak = w.keep + len(w.feed) + max(w.num_picks - 1, 0)
            needed += _cdiv(peak, page_size) - _cdiv(now, page_size)
        free = self.runner.num_free_pages
        if needed > free:
            raise OutOfPagesError(needed, free, page_size)

    # ---- state changes ---------------------------------------------------------------------

    def _feed_and_pick(self, work: dict[str, RequestWork], version: int) -> list[Proposal]:
        """Feed every request its tokens and pick its proposals, in two runner calls for the
        whole step: one ``extend`` for the tokens fed (a greedy proposer's all but its
        last, no logits; a sampled one's all, logits at the last), then the greedy
        proposers' picks from their last fed token (``ModelRunner.greedy_picks``: the C
        loop where it runs), one call per (picks, ``min_prob``) group. A sampled proposer
        then picks forward by forward (``_sample_picks``). An ahead request's first pick
        is its guess (the draft's argmax), never cut by ``min_prob``."""
        greedy = [w for w in work.values() if w.num_picks and w.feed and w.argmax_picks]
        taken = {w.request_id for w in greedy}
        others = [w for w in work.values() if w.feed and w.request_id not in taken]
        if self.reads_features:  # no C loop: the first pick comes from the ingest forward
            chunks = [SequenceChunk(w.request_id, w.feed, 1, 1, w.feed_features) for w in greedy]
        else:
            chunks = [SequenceChunk(w.request_id, w.feed[:-1], 0) for w in greedy]
        chunks += [
            SequenceChunk(w.request_id, w.feed, int(w.num_picks > 0),
                          int(w.num_picks > 0 and self.reads_features), w.feed_features)
            for w in others
        ]  # fmt: skip
        chunks = [c for c in chunks if c.token_ids]
        groups: dict[tuple[int, float, int], list[RequestWork]] = {}
        for w in greedy:
            groups.setdefault((w.num_picks, w.min_prob, w.uncut_picks), []).append(w)
        picked: dict[str, list[int]] = {}
        try:
            self._open_and_truncate(work, version)
            outputs = self.runner.forward_chunks(chunks) if chunks else []
            fed = {c.seq_id: out for c, out in zip(chunks, outputs, strict=True)}
            for (picks, min_prob, uncut), group in groups.items():
                ids = [w.request_id for w in group]
                if self.reads_features:
                    picked.update(self._picks_after_fed(ids, fed, picks, min_prob, uncut))
                    continue
                rows = self.runner.greedy_picks(
                    ids, [w.feed[-1] for w in group], picks, min_prob, uncut
                )
                picked.update(zip(ids, rows, strict=True))
        except BaseException:
            # Pages were checked up front, so this is unexpected (a cut into a cached block
            # another request shares takes a page for its copy); a truncated sequence can
            # not be restored, so drop them all and let the coordinator re-sync them.
            self.release(list(work))
            raise
        self._record_ingest(work, version)
        proposals = []
        for w in greedy:
            tokens = picked[w.request_id]
            self._seqs[w.request_id].tail += tokens[:-1]  # fed: every pick but the last
            guess = tokens.pop(0) if w.ahead_of else None
            proposals.append(Proposal(w.request_id, tokens, None, guess))
        first = {seq_id: out for seq_id, out in fed.items() if seq_id not in taken}
        first = {seq_id: out for seq_id, out in first.items() if out.logits.numel()}
        sampled = [w for w in others if w.num_picks]
        return proposals + (self._sample_picks(sampled, first) if sampled else [])

    def _picks_after_fed(
        self, ids: list[str], fed: dict[str, ChunkOutput], picks: int, min_prob: float, uncut: int
    ) -> dict[str, list[int]]:
        """A feature-reading draft's greedy picks: the first from the ingest forward's
        logits (never cut), the rest forward by forward, each reading the hidden state the
        forward before left (``greedy_picks``)."""
        firsts = [int(fed[rid].logits[-1].argmax()) for rid in ids]
        hidden = torch.cat([fed[rid].hidden for rid in ids])
        rest = self.runner.greedy_picks(ids, firsts, picks - 1, min_prob, uncut - 1, hidden)
        return {rid: [f, *r] for rid, f, r in zip(ids, firsts, rest, strict=True)}

    def _open_and_truncate(self, work: dict[str, RequestWork], version: int) -> None:
        """Opens the new requests' sequences; cuts the others to the KV they keep."""
        for w in work.values():
            if w.opens:
                self.runner.open(w.request_id)
                self._seqs[w.request_id] = HeldSequence(kv_version=version)
            else:
                self.runner.truncate(w.request_id, w.keep)

    def _record_ingest(self, work: dict[str, RequestWork], version: int) -> None:
        """The sequences' bookkeeping once the step's tokens are fed (or left pending)."""
        for w in work.values():
            seq = self._seqs[w.request_id]
            seq.num_committed += len(w.committed)
            seq.history.extend(w.committed)
            if w.committed:
                seq.last_token = w.committed[-1]
            seq.tail = list(w.ahead_of)
            seq.pending = w.pending
            seq.kv_version = version
            if self.reads_features:
                seq.pending_features = w.pending_features
                if w.committed:
                    seq.last_feature = w.committed_features[-1]


def _attempt(failed: dict[str, Exception], rid: str, check, *args) -> bool:
    """Runs one request's check; a refusal goes to ``failed``."""
    try:
        check(*args)
    except (InvalidRequestError, OutOfSyncError, UnknownRequestError) as e:
        failed[rid] = e
        return False
    return True


def _check_id(request_id: str, seen: dict | set, where: str) -> str:
    if not request_id:
        raise InvalidRequestError(f"{where}: request_id must not be empty")
    if request_id in seen:
        raise InvalidRequestError(f"{where}: request {request_id} appears twice in one step")
    return request_id


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
