"""Logits processing (penalties, logit_bias, min_tokens) inside the speculative chain, on the
tiny model: the target's greedy tokens under processing are the same one token per step
(K = 0), verifying their own continuation (K = 3, all accepted) and in one multi-step
call; proposals of the unprocessed argmax are rejected where processing changes it; raw
logprobs do not depend on K; a logit_bias id out of the vocabulary fails its entry alone;
and the draft's greedy proposals under processing are the processed argmax chain."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from service_testing import greedy_decode
from test_target_service import PROMPT, VOCAB

from specdec.draft_service.drafter import Drafter
from specdec.draft_service.steps import DraftStep, IngestPlan, ProposeEntry
from specdec.runtime.errors import InvalidRequestError
from specdec.runtime.logits_processing import LogitsProcessing
from specdec.runtime.model_runner import ModelRunner
from specdec.runtime.sampling import Sampling
from specdec.runtime.sequence import SequenceChunk
from specdec.target_service.steps import PrefillChunk, VerifyEntry
from specdec.target_service.verifier import Verifier

K = 3
NUM_TOKENS = 1 + 3 * (K + 1)  # the prefill's token, then three all-accepted verifies
BIAS = ((40, 2.0), (101, -1.0))
PENALTIES = {
    "penalising": LogitsProcessing(1.5, 0.5, 1.3, BIAS, num_prompt_tokens=len(PROMPT)),
    # Rewards repeats, so that a chain's own tokens change the argmax of its later rows.
    "rewarding": LogitsProcessing(-2.0, logit_bias=BIAS, num_prompt_tokens=len(PROMPT)),
}


def processed_greedy(runner: ModelRunner, prompt: list[int], n: int, p: LogitsProcessing):
    """Greedy decoding by hand, one token per forward, each row processed after every
    token before it; the tokens, and each one's raw logprob (log-softmax of the logits)."""
    runner.open("hand")
    tokens, logprobs, feed = list(prompt), [], prompt
    for _ in range(n):
        logits = runner.extend([SequenceChunk("hand", feed)])[0][-1:]
        tokens.append(int(p.apply(logits, tokens, ()).argmax()))
        logprobs.append(float(torch.log_softmax(logits[0].float(), -1)[tokens[-1]]))
        feed = tokens[-1:]
    runner.release("hand")
    return tokens[len(prompt) :], logprobs


@pytest.fixture(params=list(PENALTIES))
def sampling(request, make_runner) -> Sampling:
    """Greedy under PENALTIES, min_tokens keeping out the token they pick at step 2."""
    penalties = PENALTIES[request.param]
    stop = processed_greedy(make_runner(), PROMPT, 3, penalties)[0][2]
    processing = replace(penalties, min_tokens=4, min_tokens_stop_ids=(stop,))
    return Sampling(processing=processing, logprobs=3)


def start(verifier: Verifier, rid: str, sampling: Sampling):
    (r,) = verifier.verify([PrefillChunk(rid, 0, tuple(PROMPT), True, sampling)], [])
    assert r.error is None
    return r


def step(verifier: Verifier, rid: str, tokens: list[int], proposals, sampling: Sampling):
    """Verifies ``proposals`` after the prompt and ``tokens`` (emitted so far)."""
    at = len(PROMPT) + len(tokens) - 1
    (r,) = verifier.verify([], [VerifyEntry(rid, at, tokens[-1], tuple(proposals), None, sampling)])
    assert r.error is None
    return r


def decode_k0(make_runner, sampling: Sampling, n: int):
    """n tokens, one per verify; and their logprobs."""
    verifier = Verifier(make_runner())
    first = start(verifier, "a", sampling)
    tokens, logprobs = list(first.token_ids), list(first.logprobs)
    while len(tokens) < n:
        r = step(verifier, "a", tokens, (), sampling)
        tokens += r.token_ids
        logprobs += r.logprobs
    return tokens, logprobs


def test_k0_decoding_is_the_processed_greedy_chain(make_runner, sampling):
    tokens, logprobs = decode_k0(make_runner, sampling, NUM_TOKENS)
    p = sampling.processing
    by_hand, raw = processed_greedy(make_runner(), PROMPT, NUM_TOKENS, p)
    assert tokens == by_hand
    assert [lp.logprob for lp in logprobs] == pytest.approx(raw, abs=1e-4)
    assert tokens[2] != p.min_tokens_stop_ids[0]  # min_tokens moved it
    assert tokens != greedy_decode(make_runner(), PROMPT, NUM_TOKENS)  # processing matters


def test_verifying_the_k0_continuation_accepts_every_proposal(make_runner, sampling):
    expected, expected_logprobs = decode_k0(make_runner, sampling, NUM_TOKENS)
    verifier = Verifier(make_runner())
    first = start(verifier, "a", sampling)
    tokens, logprobs = list(first.token_ids), list(first.logprobs)
    while len(tokens) < NUM_TOKENS:
        proposals = expected[len(tokens) : len(tokens) + K]
        r = step(verifier, "a", tokens, proposals, sampling)
        assert r.num_accepted == K
        tokens += r.token_ids
        logprobs += r.logprobs
    assert tokens == expected
    assert len(logprobs) == len(expected_logprobs)
    for got, want in zip(logprobs, expected_logprobs, strict=True):
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
        assert got.top_ids == want.top_ids
        assert got.top_logprobs == pytest.approx(want.top_logprobs, abs=1e-4)


def test_unprocessed_greedy_proposals_are_rejected_where_processing_changes_the_argmax(
    make_runner, sampling
):
    expected, _ = decode_k0(make_runner, sampling, NUM_TOKENS + K)
    verifier, plain = Verifier(make_runner()), make_runner()
    tokens = list(start(verifier, "a", sampling).token_ids)
    rejected = 0
    while len(tokens) < NUM_TOKENS:
        proposals = greedy_decode(plain, [*PROMPT, *tokens], K)
        truth = expected[len(tokens) : len(tokens) + K]
        agree = next(
            (i for i, (a, b) in enumerate(zip(proposals, truth, strict=True)) if a != b), K
        )
        r = step(verifier, "a", tokens, proposals, sampling)
        assert r.num_accepted == agree
        assert r.token_ids == expected[len(tokens) : len(tokens) + agree + 1]
        rejected += agree < K
        tokens += r.token_ids
    assert rejected > 0


def test_multi_step_decoding_under_processing_emits_the_k0_tokens(make_runner, sampling):
    expected, _ = decode_k0(make_runner, sampling, NUM_TOKENS)
    verifier = Verifier(make_runner())
    first = start(verifier, "a", sampling).token_ids[0]
    entry = VerifyEntry("a", len(PROMPT), first, (), None, sampling)
    (r,) = verifier.verify([], [entry], num_steps=NUM_TOKENS - 1)
    assert [first, *r.token_ids] == expected


def test_a_logit_bias_id_out_of_vocabulary_fails_its_entry_alone(make_runner, sampling):
    expected, _ = decode_k0(make_runner, sampling, 2)
    verifier = Verifier(make_runner())
    first = {rid: start(verifier, rid, sampling).token_ids[0] for rid in ("bad", "good")}
    out_of_vocab = replace(sampling.processing, logit_bias=((VOCAB + 5, 1.0),))
    bad = replace(sampling, processing=out_of_vocab)
    results = verifier.verify(
        [],
        [
            VerifyEntry("bad", len(PROMPT), first["bad"], (), None, bad),
            VerifyEntry("good", len(PROMPT), first["good"], (), None, sampling),
        ],
    )
    by_id = {r.request_id: r for r in results}
    assert isinstance(by_id["bad"].error, InvalidRequestError)
    assert str(VOCAB + 5) in str(by_id["bad"].error)
    assert by_id["bad"].token_ids == [] and verifier.runner.seq_len("bad") == len(PROMPT)
    assert by_id["good"].error is None
    assert [first["good"], *by_id["good"].token_ids] == expected


def test_draft_greedy_proposals_under_processing_are_the_processed_argmax_chain(
    make_runner, sampling
):
    assert sampling.reads_history and sampling.greedy
    drafter, num = Drafter(make_runner()), 5
    p = sampling.processing

    def propose(start_position: int, committed: tuple[int, ...]) -> list[int]:
        plan = IngestPlan("r", start_position, committed)
        result = drafter.step(
            DraftStep(ingest=(plan,), propose=(ProposeEntry("r", num, sampling),))
        )
        assert not result.failed
        (proposal,) = result.proposals
        assert proposal.draft_probs is None
        return proposal.token_ids

    first = propose(0, tuple(PROMPT))
    assert first == processed_greedy(make_runner(), PROMPT, num, p)[0]
    assert first != greedy_decode(make_runner(), PROMPT, num)
    # The target accepts two and adds its own token: the next proposals follow the new log.
    committed = (*first[:2], (first[2] + 1) % VOCAB)
    after = propose(len(PROMPT), committed)
    assert after == processed_greedy(make_runner(), [*PROMPT, *committed], num, p)[0]
