"""The request surface under speculation, through the real services: logprobs, the logits
processing parameters, n > 1 and structured output give exactly what target-only decoding
(K = 0) gives with the same parameters."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import grpc
import jsonschema
import pytest
import torch
from e2e_stack import TARGET, running_stack

from specdec.client import CoordinatorClient, GenerateParams, generate_concurrently
from specdec.runtime.loader import load_hf_model
from specdec.v1 import common_pb2

pytestmark = pytest.mark.slow
NEW = 24
PROCESSING = {
    "penalties": dict(presence_penalty=1.5, frequency_penalty=0.5),
    "repetition": dict(repetition_penalty=1.6),
    "min_p-and-bias": dict(min_p=0.2, logit_bias=((60, -100.0), (12, 4.0))),
    "all": dict(presence_penalty=0.7, repetition_penalty=1.3, logit_bias=((286, 3.0),)),
}
CASES = json.loads((Path(__file__).parents[2] / "bench/prompts/json_schemas.json").read_text())
SCHEMAS = [case["schema"] for case in CASES["cases"]]


@pytest.fixture(scope="module")
def stack():
    with running_stack(speculative_config='{"num_speculative_tokens": 3}') as s:
        yield s


def both(stack, prompts, params: GenerateParams) -> tuple[list, list]:
    """Greedy completions with speculation off (K = 0) and on."""
    _, target_only = generate_concurrently(
        stack.address, prompts, replace(params, num_speculative_tokens=0)
    )
    _, speculative = generate_concurrently(stack.address, prompts, params)
    return target_only, speculative


def test_logprobs_are_the_targets_whatever_decided_the_token(stack, prompt_ids):
    prompts = [p[:12] for p in prompt_ids[:4]]
    params = GenerateParams(max_tokens=NEW, ignore_eos=True, logprobs=5)
    target_only, speculative = both(stack, prompts, params)
    for a, b in zip(target_only, speculative, strict=True):
        assert a.token_ids == b.token_ids and len(b.logprobs) == NEW
        for (lp_a, top_a), (lp_b, top_b) in zip(a.logprobs, b.logprobs, strict=True):
            assert lp_b == pytest.approx(lp_a, abs=1e-4)
            assert [t for t, _ in top_b] == [t for t, _ in top_a] and len(top_b) == 5
            assert [v for _, v in top_b] == pytest.approx([v for _, v in top_a], abs=1e-4)
        # Greedy: each token is its position's likeliest.
        assert all(top[0][0] == t for (_, top), t in zip(b.logprobs, b.token_ids, strict=True))
    assert sum(o.stats["num_accepted_tokens"] for o in speculative) > NEW


@pytest.mark.parametrize("name", list(PROCESSING))
def test_processed_greedy_output_equals_target_only(stack, prompt_ids, name):
    prompts = [p[:12] for p in prompt_ids[:4]]
    params = GenerateParams(max_tokens=NEW, ignore_eos=True, **PROCESSING[name])
    target_only, speculative = both(stack, prompts, params)
    plain = generate_concurrently(stack.address, prompts, GenerateParams(max_tokens=NEW))[1]
    assert [o.token_ids for o in speculative] == [o.token_ids for o in target_only]
    assert [o.token_ids for o in speculative] != [o.token_ids for o in plain]
    assert sum(o.stats["num_accepted_tokens"] for o in speculative) > 0


def test_min_tokens_holds_back_a_stop_token(stack, prompt_ids):
    prompt = prompt_ids[0][:12]
    with CoordinatorClient(stack.address) as client:
        free = client.generate(prompt, GenerateParams(max_tokens=NEW))
        stop = free.token_ids[2]
        stopped = client.generate(prompt, GenerateParams(max_tokens=NEW, stop_token_ids=(stop,)))
        held = client.generate(
            prompt, GenerateParams(max_tokens=NEW, stop_token_ids=(stop,), min_tokens=8)
        )
    assert stopped.token_ids == free.token_ids[:3] and stopped.finish_reason == "stop"
    assert len(held.token_ids) >= 8 and stop not in held.token_ids[:8]


def test_n_samples_are_seeded_choices_sharing_the_prompt(stack, prompt_ids):
    prompt = prompt_ids[1][:40]  # over two pages: its full blocks are shared
    params = GenerateParams(max_tokens=12, temperature=1.0, seed=11, n=4, ignore_eos=True)
    with CoordinatorClient(stack.address) as client:
        first = client.generate_samples(prompt, params)
        again = client.generate_samples(prompt, params)
        alone = client.generate(prompt, replace(params, n=1, seed=12))
    assert len(first) == 4 and all(len(o.token_ids) == 12 for o in first)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert len({tuple(o.token_ids) for o in first}) > 1
    assert first[1].token_ids == alone.token_ids  # sample i draws as seed + i alone
    assert all(o.stats["num_cached_tokens"] >= 32 for o in first[1:])


def test_json_schemas_hold_and_greedy_equals_target_only(stack):
    prompts = [f"Answer in JSON ({i}):" for i in range(len(SCHEMAS))]
    params = [
        GenerateParams(
            max_tokens=120,
            structured_output=common_pb2.StructuredOutput(json_schema=json.dumps(schema)),
        )
        for schema in SCHEMAS
    ]
    _, speculative = generate_concurrently(stack.address, prompts, params)
    _, target_only = generate_concurrently(
        stack.address, prompts, [replace(p, num_speculative_tokens=0) for p in params]
    )
    for schema, a, b in zip(SCHEMAS, target_only, speculative, strict=True):
        assert b.token_ids == a.token_ids and b.finish_reason == "stop"
        jsonschema.validate(json.loads(b.text), schema)
    assert sum(o.stats["num_accepted_tokens"] for o in speculative) > 0


def test_min_tokens_yields_to_a_grammar_that_may_only_end(stack):
    """Choices shorter than min_tokens end at their EOS, sampled or greedy, on both
    services (the draft proposes under the same rule)."""
    choice = common_pb2.StructuredOutput(choice=common_pb2.ChoiceList(choices=["yes", "no"]))
    params = [
        GenerateParams(max_tokens=16, min_tokens=6, structured_output=choice, temperature=t, seed=s)
        for t in (0.0, 0.7)
        for s in range(4)
    ]
    _, outs = generate_concurrently(stack.address, ["Is it?"] * len(params), params)
    assert all(o.text in ("yes", "no") and o.finish_reason == "stop" for o in outs)


def test_a_malformed_schema_is_invalid_argument_and_the_next_request_runs(stack):
    bad = common_pb2.StructuredOutput(json_schema='{"type": "object", "properties": ')
    with CoordinatorClient(stack.address) as client:
        with pytest.raises(grpc.RpcError) as caught:
            client.generate("x", GenerateParams(max_tokens=4, structured_output=bad))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "json_schema" in caught.value.details()
        assert len(client.generate("x", GenerateParams(max_tokens=4)).token_ids) == 4


def test_prompt_logprobs_are_the_targets_across_chunks(prompt_ids):
    """A prompt over several prefill chunks (16 tokens a step): each token's logprob and top
    tokens as transformers computes them on the target; a second run, which could have
    taken the prompt from the prefix cache, computes and returns them all again."""
    prompt = prompt_ids[2][:45]
    config = dict(speculative_config='{"num_speculative_tokens": 3}', max_num_batched_tokens=16)
    params = GenerateParams(max_tokens=4, prompt_logprobs=3, logprobs=1)
    with running_stack(**config) as s, CoordinatorClient(s.address) as client:
        first, again = client.generate(prompt, params), client.generate(prompt, params)
        alone = client.generate(prompt[:1], params)  # one token: nothing to score
    with torch.no_grad():
        logits = load_hf_model(TARGET)(torch.tensor([prompt])).logits[0]
    exact = torch.log_softmax(logits.double(), -1)
    assert len(first.prompt_logprobs) == len(prompt) - 1
    for position, (logprob, top) in enumerate(first.prompt_logprobs, start=1):
        row = exact[position - 1]
        assert logprob == pytest.approx(float(row[prompt[position]]), abs=1e-3)
        assert [t for t, _ in top] == row.topk(3).indices.tolist()
    assert [lp for lp, _ in again.prompt_logprobs] == pytest.approx(
        [lp for lp, _ in first.prompt_logprobs], abs=1e-5
    )
    assert again.stats["num_cached_tokens"] == 0 and again.token_ids == first.token_ids
    assert alone.prompt_logprobs == [] and len(alone.token_ids) == 4
