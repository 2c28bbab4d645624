"""The target's final hidden states (VerifyRequest.return_features), what a feature-reading
draft ingests: every position a prefill chunk computes, the positions a verify keeps, one
per token a multi-step burst emits; each row the hidden state a plain forward gives."""

from __future__ import annotations

import torch
from service_testing import chunk, entry
from test_target_service import PROMPT

from specdec.model_service.proto import features_from_bytes
from specdec.runtime.sequence import SequenceChunk
from specdec.target_service.server import create_server
from specdec.v1 import target_pb2, target_pb2_grpc


def call(stub, prefill=(), decode=(), num_steps=1) -> list[target_pb2.VerifyResult]:
    request = target_pb2.VerifyRequest(
        prefill=prefill, decode=decode, num_steps=num_steps, return_features=True
    )
    return list(stub.Verify(request).results)


def hidden_states(runner, tokens: list[int]) -> torch.Tensor:
    runner.open("ref")
    try:
        chunk_ = SequenceChunk("ref", tokens, 1, len(tokens))
        return runner.forward_chunks([chunk_])[0].hidden
    finally:
        runner.release("ref")


def rows(result, hidden) -> torch.Tensor:
    return features_from_bytes(result.features, len(result.features) // (2 * hidden), hidden)


def test_the_target_returns_the_hidden_states_of_the_positions_it_keeps(start_server, make_runner):
    server = start_server(create_server, kv_cache_dtype="auto")
    stub = target_pb2_grpc.TargetServiceStub(server.channel)
    hidden = server.runner.model_config.hidden_size
    (first,) = call(stub, [chunk("r", 0, PROMPT[:6])])
    (second,) = call(stub, [chunk("r", 6, PROMPT[6:], True)])
    token = second.token_ids[0]
    log = [*PROMPT, token]
    reference = hidden_states(make_runner(kv_cache_dtype="auto"), log + [7, 8, 9, 10])
    assert (first.feature_start, second.feature_start) == (0, 6)
    got = torch.cat([rows(first, hidden), rows(second, hidden)])
    torch.testing.assert_close(got, reference[: len(PROMPT)], atol=2e-2, rtol=0)
    # A verify keeps the last token's and the accepted proposals' positions.
    (result,) = call(stub, decode=[entry("r", len(PROMPT), token, [7, 8])])
    kept = result.num_accepted + 1
    assert result.feature_start == len(PROMPT)
    torch.testing.assert_close(
        rows(result, hidden), reference[len(PROMPT) : len(PROMPT) + kept], atol=2e-2, rtol=0
    )
    # A multi-step burst: one row per emitted token, from the fed token's position.
    held = result.num_cached_tokens
    (burst,) = call(stub, decode=[entry("r", held, result.token_ids[-1], [])], num_steps=4)
    assert burst.feature_start == held and len(burst.token_ids) == 4
    full = [*PROMPT, token, *result.token_ids, *burst.token_ids]
    reference = hidden_states(make_runner(kv_cache_dtype="auto"), full)
    torch.testing.assert_close(rows(burst, hidden), reference[held : held + 4], atol=2e-2, rtol=0)


def test_no_features_unless_asked(target):
    _, stub = target
    request = target_pb2.VerifyRequest(prefill=[chunk("r", 0, PROMPT, True)])
    (result,) = stub.Verify(request).results
    assert result.features == b"" and len(result.token_ids) == 1
