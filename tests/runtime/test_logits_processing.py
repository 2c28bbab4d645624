"""A request's logits processing and the new sampling surface, against naive references:
``LogitsProcessing.apply`` (min_tokens, logit_bias, repetition / frequency / presence
penalties, position by position along a chain) against plain loops over positions and
tokens with vLLM's meanings; ``logits_to_probs``'s min_p; ``token_logprobs``; and
``Sampling.from_proto``'s checks of the new SamplingParams fields."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.kernels.sampling import logits_to_probs, token_logprobs
from specdec.runtime.errors import InvalidRequestError
from specdec.runtime.logits_processing import LogitsProcessing
from specdec.runtime.sampling import Sampling
from specdec.runtime.sampling_limits import MAX_LOGPROBS
from specdec.v1 import common_pb2

VOCAB, ROWS, NUM_PROMPT = 50, 4, 10


def naive_apply(logits: torch.Tensor, history, chain, p: LogitsProcessing) -> torch.Tensor:
    """vLLM's processing, one position and one token at a time."""
    bias = dict(p.logit_bias)
    out = logits.tolist()
    for r in range(len(out)):
        before = list(history) + list(chain[:r])
        prompt, output = before[: p.num_prompt_tokens], before[p.num_prompt_tokens :]
        for t in range(VOCAB):
            x = out[r][t]
            if len(output) < p.min_tokens and t in p.min_tokens_stop_ids:
                x = -math.inf
            x += bias.get(t, 0.0)
            if t in prompt or t in output:
                x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
            x -= p.frequency_penalty * output.count(t)
            if t in output:
                x -= p.presence_penalty
            out[r][t] = x
    return torch.tensor(out, dtype=torch.float32)


def random_case(seed: int, num_output: int):
    """Logits of both signs; a history and chain drawn from a small range so that tokens
    repeat within and across the prompt, the output and the chain."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(ROWS, VOCAB, generator=g) * 3
    history = torch.randint(0, 20, (NUM_PROMPT + num_output,), generator=g).tolist()
    chain = torch.randint(0, 20, (ROWS - 1,), generator=g).tolist()
    return logits, history, chain


STOPS = (4, 11, 17)
CASES = {
    "presence": dict(presence_penalty=0.7),
    "frequency": dict(frequency_penalty=0.4),
    "negative-frequency": dict(frequency_penalty=-0.3),
    "repetition": dict(repetition_penalty=1.3),
    "repetition-below-one": dict(repetition_penalty=0.6),
    "logit-bias": dict(logit_bias=((3, 2.5), (7, -4.0), (49, 1.0))),
    "min-tokens": dict(min_tokens=8, min_tokens_stop_ids=STOPS),
    "all": dict(
        presence_penalty=1.5,
        frequency_penalty=0.5,
        repetition_penalty=1.3,
        logit_bias=((4, 3.0), (12, -2.0)),
        min_tokens=7,
        min_tokens_stop_ids=STOPS,
    ),
}


@pytest.mark.parametrize("num_output", [6, 0], ids=["mid-output", "first-output"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_apply_equals_the_naive_reference(name, seed, num_output):
    p = LogitsProcessing(**CASES[name], num_prompt_tokens=NUM_PROMPT)
    logits, history, chain = random_case(seed, num_output)
    got = p.apply(logits, history, chain)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, naive_apply(logits, history, chain, p), rtol=1e-6, atol=1e-5)
    assert not torch.equal(got, logits)  # every case changes something


@pytest.mark.parametrize(
    ("min_tokens", "blocked_rows"),
    [(6, 0), (7, 1), (8, 2), (9, 3), (10, 4), (50, 4)],
)
def test_min_tokens_blocks_the_stop_ids_only_in_rows_before_enough_output(min_tokens, blocked_rows):
    # 6 output tokens in the history: row r follows 6 + r of them.
    logits, history, chain = random_case(3, num_output=6)
    p = LogitsProcessing(
        min_tokens=min_tokens, min_tokens_stop_ids=STOPS, num_prompt_tokens=NUM_PROMPT
    )
    got = p.apply(logits, history, chain)
    stops = list(STOPS)
    assert torch.isneginf(got[:blocked_rows, stops]).all()
    assert torch.isfinite(got[blocked_rows:]).all()
    others = [t for t in range(VOCAB) if t not in STOPS]
    assert torch.equal(got[:, others], logits[:, others])
    torch.testing.assert_close(got, naive_apply(logits, history, chain, p))


def test_defaults_are_inactive_and_change_nothing():
    logits, history, chain = random_case(4, num_output=6)
    for p in (LogitsProcessing(), LogitsProcessing(min_tokens=5, num_prompt_tokens=3)):
        assert not p.active
        assert torch.equal(p.apply(logits, history, chain), logits)
    assert not Sampling().reads_history
    assert Sampling().processed(logits, history, chain) is logits


def naive_min_p_probs(logits, temperature, min_p, top_k=0) -> torch.Tensor:
    rows = []
    for row in logits.double().tolist():
        p = [math.exp(x / temperature) for x in row]
        kept = [i for i, x in enumerate(p) if x >= min_p * max(p)]
        if top_k:
            kept = sorted(kept, key=lambda i: -p[i])[:top_k]
        total = sum(p[i] for i in kept)
        rows.append([p[i] / total if i in kept else 0.0 for i in range(len(p))])
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize(
    ("temperature", "min_p", "top_k"),
    [(1.0, 0.1, 0), (0.5, 0.1, 0), (2.0, 0.05, 0), (1.0, 0.02, 3), (0.7, 0.9, 0)],
)
def test_min_p_matches_the_naive_reference_after_temperature(temperature, min_p, top_k):
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(5)) * 2
    got = logits_to_probs(logits, temperature, top_k=top_k, min_p=min_p)
    want = naive_min_p_probs(logits, temperature, min_p, top_k)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got > 0, want > 0)
    assert (got > 0).sum() < got.numel()  # some tokens were dropped


@pytest.mark.parametrize("min_p", [0.999, 1.0])
def test_min_p_keeps_at_least_the_likeliest_token(min_p):
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(6)) * 0.01
    probs = logits_to_probs(logits, 1.0, min_p=min_p)
    best = logits.argmax(-1)
    assert (probs[torch.arange(3), best] > 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))


def test_token_logprobs_are_the_log_softmax_and_its_sorted_top_k():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(7)) * 4
    tokens = [5, 0, 49]
    got = token_logprobs(logits, tokens, 4)
    for row, token, lp in zip(logits.double().tolist(), tokens, got, strict=True):
        norm = math.log(sum(math.exp(x) for x in row))
        assert lp.logprob == pytest.approx(row[token] - norm, abs=1e-5)
        ranked = sorted(range(VOCAB), key=lambda t: -row[t])[:4]
        assert lp.top_ids == tuple(ranked)
        assert lp.top_logprobs == pytest.approx([row[t] - norm for t in ranked], abs=1e-5)
        assert list(lp.top_logprobs) == sorted(lp.top_logprobs, reverse=True)
    assert token_logprobs(logits, tokens, 0)[1].top_ids == ()


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        (dict(min_p=1.5), "min_p"),
        (dict(min_p=math.nan), "min_p"),
        (dict(repetition_penalty=-1.0), "repetition_penalty"),
        (dict(repetition_penalty=math.inf), "repetition_penalty"),
        (dict(repetition_penalty=math.nan), "repetition_penalty"),
        (dict(presence_penalty=math.inf), "penalties"),
        (dict(frequency_penalty=math.nan), "penalties"),
        (dict(logit_bias={5: -math.inf}), "logit_bias"),
        (dict(logprobs=MAX_LOGPROBS + 1), "logprobs"),
    ],
)
def test_from_proto_refuses_bad_new_fields(fields, needle):
    msg = common_pb2.SamplingParams(**fields)
    with pytest.raises(InvalidRequestError, match=needle):
        Sampling.from_proto(msg, "r")


def test_from_proto_maps_the_new_fields():
    assert (
        Sampling.from_proto(common_pb2.SamplingParams(), "r").processing.repetition_penalty == 1.0
    )
    off = Sampling.from_proto(common_pb2.SamplingParams(repetition_penalty=0.0), "r")
    assert off.processing.repetition_penalty == 1.0 and not off.reads_history
    assert off.logprobs is None
    msg = common_pb2.SamplingParams(
        min_p=0.25,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.5,
        logit_bias={9: 1.5, 3: -2.0},
        min_tokens=4,
        min_tokens_stop_ids=[2, 7],
        num_prompt_tokens=12,
        logprobs=MAX_LOGPROBS,
    )
    s = Sampling.from_proto(msg, "r")
    assert (s.min_p, s.logprobs) == (0.25, MAX_LOGPROBS)
    assert s.processing == LogitsProcessing(
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.5,
        logit_bias=((3, -2.0), (9, 1.5)),
        min_tokens=4,
        min_tokens_stop_ids=(2, 7),
        num_prompt_tokens=12,
    )
    assert Sampling.from_proto(common_pb2.SamplingParams(logprobs=0), "r").logprobs == 0


def test_min_tokens_yields_where_only_stop_tokens_are_left():
    """A row that a grammar leaves nothing but stop tokens (it may only end there) keeps
    them, rather than leave no token at all; a row with other tokens does not."""
    logits = torch.zeros(2, 6)
    logits[0, 1:] = float("-inf")  # row 0: only token 0 (a stop id) allowed
    processing = LogitsProcessing(min_tokens=5, min_tokens_stop_ids=(0,), num_prompt_tokens=2)
    out = processing.apply(logits, [7, 8], [3])
    assert out[0, 0] == 0.0 and bool(torch.isinf(out[0, 1:]).all())
    assert out[1, 0] == float("-inf") and bool((out[1, 1:] == 0).all())
