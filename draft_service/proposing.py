"""The draft's proposals beyond its argmax loop: sampled ones (and greedy ones under logits
processing), pick by pick, and at batch 1 the branches for the verify's other outcomes.

``Proposing`` is a part of ``Drafter`` (its base class), kept in its own file; it reads the
drafter's runner, held sequences and grammars, and calls its ``_lookup`` and ``release``."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from specdec.draft_service.steps import Proposal
from specdec.draft_service.work import HeldSequence, RequestWork
from specdec.kernels.random_stream import DRAFT_DOMAIN, PROPOSE_DRAW
from specdec.kernels.sampling import SparseProbs
from specdec.runtime.grammar import Grammars
from specdec.runtime.model_runner import ChunkOutput, ModelRunner
from specdec.runtime.sequence import SequenceChunk
from specdec.runtime.structured_output import GrammarError


class Proposing:
    runner: ModelRunner
    reads_features: bool
    _seqs: dict[str, HeldSequence]
    _grammars: Grammars

    def _sample_picks(
        self, work: list[RequestWork], first: dict[str, ChunkOutput]
    ) -> list[Proposal]:
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
                                  int(self.reads_features), _last_row(logits[w.request_id].hidden))
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

    def _branches(self, w: RequestWork, started: float) -> list[Proposal]:
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

    def _branch_picks(self, w: RequestWork, guess: int) -> list[int]:
        """A branch's proposals after its guess, the guess fed first (``greedy_picks``; the
        first pick never cut by ``min_prob``). The sequence's tail gains the fed tokens."""
        picked = self.runner.greedy_picks([w.request_id], [guess], w.num_tokens, w.min_prob, 1)
        self._seqs[w.request_id].tail += [guess, *picked[0]][: len(picked[0])]
        return picked[0]

    def _processed(self, w: RequestWork, logits: torch.Tensor, picked: list[int]) -> torch.Tensor:
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
        self, w: RequestWork, logits: torch.Tensor, index: int
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


def _last_row(hidden: torch.Tensor) -> torch.Tensor | None:
    return hidden[-1:] if hidden.numel() else None
