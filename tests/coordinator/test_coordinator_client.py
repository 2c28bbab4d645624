"""The client's timing of a stream: time to first token and the decode phase's rate."""

import time

from specdec.client import Completion, CoordinatorClient, GenerateParams
from specdec.v1 import coordinator_pb2


def test_generate_times_the_first_token_and_the_decode_phase(monkeypatch):
    def stream(prompt, params, timeout=None):
        yield coordinator_pb2.GenerateResponse()  # no tokens yet: not the first token
        time.sleep(0.05)
        yield coordinator_pb2.GenerateResponse(token_ids=[5])
        time.sleep(0.1)
        yield coordinator_pb2.GenerateResponse(token_ids=[6, 7, 8, 9], finish_reason="length")

    client = CoordinatorClient("127.0.0.1:1")
    monkeypatch.setattr(client, "stream", stream)
    out = client.generate([1, 2], GenerateParams(max_tokens=5))
    client.close()
    assert out.token_ids == [5, 6, 7, 8, 9]
    assert 0.05 <= out.first_token_seconds < out.seconds
    # Four tokens after the first, over the time after it.
    assert out.decode_tok_s == 4 / (out.seconds - out.first_token_seconds)


def test_decode_rate_needs_two_tokens():
    assert Completion(token_ids=[1], seconds=1.0, first_token_seconds=0.5).decode_tok_s == 0.0
    assert Completion(token_ids=[1, 2, 3], seconds=1.0, first_token_seconds=0.5).decode_tok_s == 4.0
