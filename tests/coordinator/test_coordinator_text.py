"""Incremental detokenisation and GenerateRequest validation."""

from __future__ import annotations

import pytest
from coordinator_fakes import build
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from specdec.coordinator.api.detokenizer import IncrementalDetokenizer
from specdec.coordinator.engine.core import ModelLimits
from specdec.coordinator.engine.errors import InvalidRequest
from specdec.v1 import common_pb2, coordinator_pb2


@pytest.fixture(scope="module")
def byte_tokenizer() -> Tokenizer:
    """One token per byte, so multi-byte characters span several tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def test_deltas_hold_back_incomplete_utf8_and_add_up_to_the_text(byte_tokenizer):
    text = "héllo € 漢字!"
    ids = byte_tokenizer.encode(text).ids
    assert len(ids) == len(text.encode())
    detok = IncrementalDetokenizer(byte_tokenizer)
    deltas = [detok.update([t]) for t in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text
    euro = text.index("€")
    euro_first_byte = len(text[:euro].encode())
    assert deltas[euro_first_byte] == "" and deltas[euro_first_byte + 1] == ""
    assert deltas[euro_first_byte + 2] == "€"


def test_final_update_flushes_an_incomplete_tail(byte_tokenizer):
    ids = byte_tokenizer.encode("a€").ids
    detok = IncrementalDetokenizer(byte_tokenizer)
    assert detok.update(ids[:2]) == "a"
    assert detok.update([], final=True) == "\ufffd"


LIMITS = ModelLimits(
    vocab_size=1000, max_model_len=32, eos_token_ids=frozenset({2}),
    draft_kv_scales=common_pb2.KVScaleTable(),
)  # fmt: skip


def gen(**kw) -> coordinator_pb2.GenerateRequest:
    kw.setdefault("token_ids", coordinator_pb2.TokenIds(ids=[1, 2, 3]))
    return coordinator_pb2.GenerateRequest(**kw)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (coordinator_pb2.GenerateRequest(), "no prompt"),
        (gen(token_ids=coordinator_pb2.TokenIds(ids=[])), "empty prompt"),
        (gen(token_ids=coordinator_pb2.TokenIds(ids=[1, 1000])), "token id 1000"),
        (gen(sampling=common_pb2.SamplingParams(temperature=-0.1)), "temperature"),
        (gen(sampling=common_pb2.SamplingParams(temperature=float("inf"))), "finite"),
        (gen(sampling=common_pb2.SamplingParams(temperature=float("nan"))), "finite"),
        (gen(sampling=common_pb2.SamplingParams(top_p=1.5)), "top_p"),
        (gen(sampling=common_pb2.SamplingParams(top_p=-0.5)), "top_p"),
        (gen(max_tokens=30), "exceeds max_model_len"),
        (gen(token_ids=coordinator_pb2.TokenIds(ids=[1] * 32)), "max_model_len is 32"),
        (coordinator_pb2.GenerateRequest(text="hi"), "needs a tokenizer"),
    ],
)
def test_invalid_requests_are_refused_with_a_reason(message, error):
    with pytest.raises(InvalidRequest, match=error):
        build(LIMITS, message)


def test_request_defaults_unset_top_p_and_max_tokens(byte_tokenizer):
    req = build(LIMITS, gen(request_id="x", num_speculative_tokens=0))
    assert req.request_id == "x" and req.sampling.top_p == 1.0
    assert req.max_tokens == 32 - 3 and req.k_cap == 0
    assert build(LIMITS, gen()).k_cap is None
    text_req = build(LIMITS, coordinator_pb2.GenerateRequest(text="hé"), byte_tokenizer)
    assert text_req.prompt_ids == byte_tokenizer.encode("hé").ids


def test_a_long_output_streams_each_character_as_soon_as_it_is_complete(byte_tokenizer):
    text = "def f(x):\n    return x + 1  # é\n" * 20
    ids = byte_tokenizer.encode(text).ids
    detok = IncrementalDetokenizer(byte_tokenizer)
    deltas = [detok.update([t]) for t in ids]
    assert "".join(deltas) + detok.update([], final=True) == text
    # One byte per token: an ASCII token is its character at once; é's first byte waits.
    assert sum(d == "" for d in deltas) == text.count("é")


@pytest.mark.parametrize("temperature", [1e-38, 1e-45, 9e-6])
def test_temperatures_too_small_to_divide_by_are_greedy(temperature):
    message = gen(sampling=common_pb2.SamplingParams(temperature=temperature, top_k=5))
    assert build(LIMITS, message).sampling.greedy
    sampled = gen(sampling=common_pb2.SamplingParams(temperature=1e-4))
    assert build(LIMITS, sampled).sampling.temperature == pytest.approx(1e-4)
