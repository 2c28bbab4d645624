"""The draft model's side of a step: ingest committed tokens, then propose K of its own.

Plain domain code (no gRPC): the servicer turns messages into the dataclasses of
``draft_service.steps`` and back.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from specdec.draft_service.prompt_lookup import TokenHistory, check_ngram
from specdec.draft_service.steps import (
    DraftStep,
    DraftStepResult,
    IngestPlan,
    Proposal,
    ProposeEntry,
)
from specdec.kernels.paged_kv_cache import OutOfPagesError
from specdec.kernels.random_stream import DRAFT_DOMAIN, PROPOSE_DRAW, RandomStream
from specdec.kernels.sampling import SparseProbs
from specdec.runtime.errors import InvalidRequestError, OutOfSyncError, UnknownRequestError
from specdec.runtime.grammar import Grammars, GrammarTokenizer
from specdec.runtime.kv_scales import KVScaleTable
from specdec.runtime.model_runner import ChunkOutput, ModelRunner
from specdec.runtime.sampling import Sampling
from specdec.runtime.sequence import SequenceChunk
from specdec.runtime.structured_output import GrammarError

RESYNC_HINT = "re-sync from the log (release, then ingest from 0)"


@dataclass
class _Sequence:
    """What the draft holds for one request: KV = committed tokens - ``pending`` + ``tail``.

    ``tail`` are tokens past the committed length whose KV is cached: the draft's own
    proposals it fed itself, and when pipelining the ahead_of tokens and its guess; the
    next ingest keeps the part of it the coordinator committed. ``pending``
    are the last committed tokens whose KV is not computed yet (ingested at K = 0 steps:
    the next proposal computes them first; never both a tail and pending tokens).
    """

    kv_version: int
    num_committed: int = 0
    last_token: int = -1
    tail: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    # A feature-reading draft: the features of the pending tokens, and of the last
    # committed one (what feeding it again needs).
    pending_features: torch.Tensor | None = None
    last_feature: torch.Tensor | None = None
    stream: RandomStream | None = None  # the draft's own draws, made on the first sampled step
    history: TokenHistory = field(default_factory=TokenHistory)  # the committed ids


@dataclass
class _Work:
    """One request's part of this step, decided before any state changes."""

    request_id: str
    committed: tuple[int, ...] = ()  # tokens the plan adds to the committed log
    keep: int = 0  # KV length to truncate to before the ingest forward
    feed: list[int] = field(default_factory=list)  # tokens of the ingest forward
    pending: list[int] = field(default_factory=list)  # committed, KV left for later
    # A feature-reading draft: rows for committed, feed and pending (None elsewhere).
    committed_features: torch.Tensor | None = None
    feed_features: torch.Tensor | None = None
    pending_features: torch.Tensor | None = None
    num_tokens: int = 0  # K (0: ingest only)
    sampling: Sampling = Sampling()
    ahead_of: tuple[int, ...] = ()  # fed after the committed tokens, kept as tail
    min_prob: float = 0.0
    prompt_lookup: tuple[int, int] = (0, 0)
    looked_up: list[int] = field(default_factory=list)  # proposals found by prompt lookup
    num_branches: int = 1
    branch_budget_s: float = 0.0
    opens: bool = False
    eager: bool = False  # feed the ingested tokens now even with no picks

    @property
    def num_picks(self) -> int:
        """Tokens the propose loop picks: the K proposals, after a guess when ahead; none
        where prompt lookup found them."""
        if self.looked_up:
            return 0
        return self.num_tokens + (1 if self.ahead_of else 0)

    @property
    def uncut_picks(self) -> int:
        """Leading picks ``min_prob`` never cuts: the guess when ahead, and the first
        proposal."""
        return 2 if self.ahead_of else 1


class Drafter:
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
        self._seqs: dict[str, _Sequence] = {}
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
            if w.ahead_of and _argmax_picks(w) and w.num_branches > 1:
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
    ) -> dict[str, _Work]:
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
        work: dict[str, _Work] = {}
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

    def _plan_ingest(self, plan: IngestPlan, work: dict[str, _Work]) -> None:
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
        work[rid] = _Work(
            rid,
            plan.token_ids,
            opens=rid not in self._seqs,
            eager=plan.eager,
            committed_features=self._rows(plan.features, len(plan.token_ids)),
        )

    def _plan_propose(self, entry: ProposeEntry, work: dict[str, _Work]) -> None:
        rid, max_len = entry.request_id, self.runner.max_model_len
        if entry.num_tokens <= 0:
            raise InvalidRequestError(f"request {rid}: num_tokens must be > 0")
        if rid not in self._seqs and rid not in work:
            raise UnknownRequestError(
                f"request {rid}: the draft holds no sequence for it; ingest it from 0"
            )
        w = work.get(rid, _Work(rid))
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

    def _lookup(self, w: _Work, extra: tuple[int, ...]) -> list[int]:
        """Prompt lookup's proposals after the request's history and ``extra``; [] where
        it found none, is off, or the request samples."""
        if not w.sampling.greedy or not any(w.prompt_lookup):
            return []
        seq = self._seqs.get(w.request_id)
        history = seq.history if seq else TokenHistory()
        return history.propose(extra, w.prompt_lookup, w.num_tokens)

    def _look_up_ahead(self, w: _Work, p: Proposal) -> Proposal:
        """An ahead proposal is, like any, prompt lookup's where it finds one after
        ahead_of and the guess (the model's forwards then served only the guess)."""
        looked = self._lookup(w, (*w.ahead_of, p.guessed_token_id)) if w.ahead_of else []
        return replace(p, token_ids=looked, looked_up=True) if looked else p

    def _decide_feed(self, w: _Work) -> None:
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

    def _check_pages(self, work: dict[str, _Work]) -> None:
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

    def _feed_and_pick(self, work: dict[str, _Work], version: int) -> list[Proposal]:
        """Feed every request its tokens and pick its proposals, in two runner calls for the
        whole step: one ``extend`` for the tokens fed (a greedy proposer's all but its
        last, no logits; a sampled one's all, logits at the last), then the greedy
        proposers' picks from their last fed token (``ModelRunner.greedy_picks``: the C
        loop where it runs), one call per (picks, ``min_prob``) group. A sampled proposer
        then picks forward by forward (``_sample_picks``). An ahead request's first pick
        is its guess (the draft's argmax), never cut by ``min_prob``."""
        greedy = [w for w in work.values() if w.num_picks and w.feed and _argmax_picks(w)]
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
        groups: dict[tuple[int, float, int], list[_Work]] = {}
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

    def _open_and_truncate(self, work: dict[str, _Work], version: int) -> None:
        """Opens the new requests' sequences; cuts the others to the KV they keep."""
        for w in work.values():
            if w.opens:
                self.runner.open(w.request_id)
                self._seqs[w.request_id] = _Sequence(kv_version=version)
            else:
                self.runner.truncate(w.request_id, w.keep)

    def _record_ingest(self, work: dict[str, _Work], version: int) -> None:
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

    def _sample_picks(self, work: list[_Work], first: dict[str, ChunkOutput]) -> list[Proposal]:
        """Sampled proposals (and greedy ones under logits processing), forward by forward:
        each further pick is one forward over the requests still picking (a
        feature-reading draft's reads the hidden state the forward before left). An ahead
        request's first pick is its guess (the draft's argmax), the rest its proposals. A
        request stops picking at its first proposal after the first less likely than its
        ``min_prob``. Each pick's logits are processed after the committed log and the
        picks before it, as the target processes that position."""
        tokens: dict[str, list[int]] = {w.request_id: [] for w in work}
        probs: dict[str, list[SparseProbs]] = {w.request_id: [] for w in work}
        stopped: set[str] = set()
        logits = first
        num_picks = max(w.num_picks for w in work)
        for position in range(num_picks):
            active = [w for w in work if w.num_picks > position and w.request_id not in stopped]
            if not active:
                break
            if position > 0:
                chunks = [
                    SequenceChunk(w.request_id, [tokens[w.request_id][-1]], 1,
                                  int(self.reads_features), _last(logits[w.request_id].hidden))
                    for w in active
                ]  # fmt: skip
                outs = self.runner.forward_chunks(chunks)
                logits = {c.seq_id: out for c, out in zip(chunks, outs, strict=True)}
                for w in active:
                    self._seqs[w.request_id].tail.append(tokens[w.request_id][-1])
            for w in active:
                rid = w.request_id
                row_logits = self._processed(w, logits[rid].logits[-1:], tokens[rid])
                if w.ahead_of and position == 0:
                    tokens[rid].append(int(row_logits[-1].argmax()))
                    continue
                index = position - (1 if w.ahead_of else 0)
                token, row = self._sample(w, row_logits, index)
                if token is None:
                    stopped.add(w.request_id)
                    continue
                tokens[w.request_id].append(token)
                if row is not None:  # greedy: no q
                    probs[w.request_id].append(row)
        proposals = []
        for w in work:
            picked = tokens[w.request_id]
            guess = picked.pop(0) if w.ahead_of else None
            proposals.append(Proposal(w.request_id, picked, probs[w.request_id] or None, guess))
        return proposals

    def _branches(self, w: _Work, started: float) -> list[Proposal]:
        """After a greedy ahead proposal (the all-accepted branch), the proposals for
        ``ahead_of[a]`` rejected, a = 0, 1, ... (``num_branches`` - 1 of them): each after
        ``ahead_of[:a]`` and the draft's likeliest token other than ``ahead_of[a]`` (its
        guess of the target's correction), exactly what the draft proposes once the
        coordinator commits that. One forward gives the guesses; each branch then feeds
        its guess and picks as a proposal does, the deepest branch first so that each finds
        its prefix of ``ahead_of`` still in the KV. The KV and tail left are branch 0's (the
        likeliest outcome); the next step keeps of them what the commit matches. With a
        ``branch_budget_s``, only as many run as end within that long after ``started``
        at the pace of the step so far (the all-accepted branch's): the deepest ones, the
        least likely outcomes, are the ones dropped."""
        rid, ahead = w.request_id, list(w.ahead_of)
        branches = list(range(min(w.num_branches - 1, len(ahead))))
        if w.branch_budget_s > 0:
            pace = time.monotonic() - started  # what the all-accepted branch took
            fit = int((w.branch_budget_s - pace) // pace) if pace > 0 else len(branches)
            branches = branches[: max(fit, 0)]
        if not branches:
            return []
        seq = self._seqs[rid]
        held = seq.num_committed
        try:
            # Logits at the last committed token and at ahead_of[:top]: row a scores ahead_of[a].
            top = branches[-1]
            self.runner.truncate(rid, held - 1)
            chunk = SequenceChunk(rid, [seq.last_token, *ahead[:top]], top + 1)
            rows = self.runner.extend([chunk])[0]
            seq.tail = ahead[:top]
            proposals = []
            for a in reversed(branches):
                ranked = rows[a].topk(2).indices.tolist()
                guess = ranked[1] if ranked[0] == ahead[a] else ranked[0]
                looked = self._lookup(w, (*ahead[:a], guess))
                if looked:  # no forward: the KV stays the deeper branch's
                    proposals.append(
                        Proposal(rid, looked, None, guess, looked_up=True, ahead_accepted=a)
                    )
                    continue
                self.runner.truncate(rid, held + a)
                seq.tail = list(ahead[:a])
                picks = self._branch_picks(w, guess)
                proposals.append(Proposal(rid, picks, None, guess, ahead_accepted=a))
        except BaseException:
            self.release([rid])  # half-made branches cannot be restored: re-sync it
            raise
        return proposals[::-1]

    def _branch_picks(self, w: _Work, guess: int) -> list[int]:
        """A branch's proposals after its guess, the guess fed first (``greedy_picks``; the
        first pick never cut by ``min_prob``). The sequence's tail gains the fed tokens."""
        picked = self.runner.greedy_picks([w.request_id], [guess], w.num_tokens, w.min_prob, 1)
        self._seqs[w.request_id].tail += [guess, *picked[0]][: len(picked[0])]
        return picked[0]

    def _processed(self, w: _Work, logits: torch.Tensor, picked: list[int]) -> torch.Tensor:
        """A pick's logits after the request's processing: the position follows the
        committed log, ``ahead_of`` and the picks before (``picked``)."""
        if not w.sampling.reads_history:
            return logits
        before = np.concatenate([self._seqs[w.request_id].history.ids, w.ahead_of, picked])
        before = before.astype(np.int64)
        allowed = None
        if w.sampling.grammar is not None:
            output = before[w.sampling.processing.num_prompt_tokens :].tolist()
            # A grammar the draft cannot build leaves its proposals unmasked: fewer are
            # accepted, and the target's mask keeps the output exact.
            with contextlib.suppress(GrammarError):
                allowed = self._grammars.masks(w.request_id, w.sampling.grammar, output, (), 1)
        return w.sampling.processed(logits, before, (), allowed)

    def _sample(
        self, w: _Work, logits: torch.Tensor, index: int
    ) -> tuple[int | None, SparseProbs | None]:
        """A draw from q and q itself, q being the request's distribution cut to its
        MAX_DRAFT_SUPPORT likeliest tokens (what travels; greedy under logits processing:
        the argmax and no q); the draw is keyed by the proposal's absolute position, so a
        draft rebuilt from the log proposes the same.
        ``(None, None)`` where q's likeliest token is below ``min_prob`` and it is not the
        first proposal (``index`` 0): the proposals end here."""
        cut = w.min_prob if index > 0 else 0.0
        if w.sampling.greedy:  # under logits processing (else the greedy path picks)
            token = int(logits[-1].argmax())
            if cut and float(torch.softmax(logits[-1], -1)[token]) < cut:
                return None, None
            return token, None
        seq = self._seqs[w.request_id]
        if seq.stream is None:
            seq.stream = w.sampling.random_stream(DRAFT_DOMAIN)
        q = SparseProbs.of(w.sampling.probs(logits[-1:])[0])
        if cut and float(q.probs.max()) < cut:
            return None, None
        # Ahead, the proposal's position counts the ahead_of tokens and the guess.
        position = seq.num_committed + (len(w.ahead_of) + 1 if w.ahead_of else 0) + index
        return q.sample(seq.stream.uniform(position, PROPOSE_DRAW)), q


def _argmax_picks(w: _Work) -> bool:
    """The request's proposals are the draft's argmax picks (``greedy_picks``)."""
    return w.sampling.greedy and not w.sampling.reads_history


def _last(hidden: torch.Tensor) -> torch.Tensor | None:
    return hidden[-1:] if hidden.numel() else None


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
