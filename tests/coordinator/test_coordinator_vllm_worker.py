"""The gateway protocol's request mapping, refusals, stop strings and tokenizer bundle."""

from __future__ import annotations

import asyncio
import hashlib
import io
import zipfile
from types import SimpleNamespace

import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from tokenizers import Tokenizer

from specdec.config import TINY_TARGET
from specdec.coordinator.api.prompts import PromptEncoder
from specdec.coordinator.api.vllm_outputs import (
    InIndexOrder,
    StopStrings,
    input_logprobs,
    output_logprobs,
)
from specdec.coordinator.api.vllm_worker import (
    request_from_proto,
    tokenizer_archive,
    unsupported_fields,
)
from specdec.coordinator.engine.core import ModelLimits
from specdec.coordinator.engine.errors import InvalidRequest
from specdec.v1 import common_pb2

ENGINE = SimpleNamespace(
    limits=ModelLimits(
        vocab_size=4096, max_model_len=2048, eos_token_ids=frozenset({0}),
        draft_kv_scales=common_pb2.KVScaleTable(),
    )
)  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TINY_TARGET / "tokenizer.json"))


def from_proto(message, tokenizer=None, scope=""):
    """``request_from_proto`` as the servicer calls it."""
    limit = ENGINE.limits.max_model_len
    encoder = PromptEncoder(tokenizer, None, limit) if tokenizer else None
    return asyncio.run(request_from_proto(message, ENGINE, encoder, scope))


def generate(**sampling) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="r1",
        tokenized=pb.TokenizedInput(input_ids=[5, 6, 7]),
        sampling_params=pb.SamplingParams(**sampling),
    )


def test_defaults_follow_vllm():
    req = from_proto(generate())
    assert req.sampling.temperature == 1.0  # unset temperature: vLLM's default
    assert req.sampling.top_p == 1.0 and req.sampling.top_k == 0
    assert req.max_tokens == 2048 - 3  # unset max_tokens: the rest of the context
    req = from_proto(
        generate(temperature=0, max_tokens=9, seed=4, stop_token_ids=[11], ignore_eos=True)
    )
    assert req.sampling.greedy and req.sampling.seed == 4 and req.max_tokens == 9
    assert req.stop_token_ids == {11} and req.ignore_eos


@pytest.mark.parametrize(
    "sampling, field",
    [
        ({"truncate_prompt_tokens": 8}, "sampling_params.truncate_prompt_tokens"),
        ({"structural_tag": "{}"}, "sampling_params.structural_tag"),
    ],
)
def test_what_specdec_cannot_honour_is_refused_by_name(sampling, field):
    message = generate(**sampling)
    assert unsupported_fields(message) == [field]
    with pytest.raises(InvalidRequest, match=field.replace(".", r"\.")):
        from_proto(message)


def test_the_processing_fields_reach_the_request():
    req = from_proto(
        generate(
            temperature=0.5,
            min_p=0.1,
            presence_penalty=0.5,
            frequency_penalty=-0.25,
            repetition_penalty=1.2,
            min_tokens=3,
            logit_bias={9: -100.0, 3: 2.5},
            logprobs=5,
            prompt_logprobs=2,
        )
    )
    s = req.sampling
    assert (s.min_p, s.presence_penalty, s.frequency_penalty) == pytest.approx((0.1, 0.5, -0.25))
    assert s.repetition_penalty == pytest.approx(1.2) and s.min_tokens == 3
    assert s.logit_bias == ((3, 2.5), (9, -100.0)) and s.logprobs == 5
    assert s.prompt_logprobs == 2


@pytest.mark.parametrize(
    "sampling, words",
    [
        ({"logprobs": -1}, "every token's"),
        ({"logprobs": 21}, r"logprobs must be in \[0, 20\]"),
        ({"prompt_logprobs": -1}, "every token's"),
        ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2, 2\]"),
        ({"repetition_penalty": -1}, "repetition_penalty must be a finite number > 0"),
        ({"min_p": 1.5}, r"min_p must be in \[0, 1\]"),
        ({"logit_bias": {70000: 1.0}}, "logit_bias names token id 70000"),
        ({"logit_bias": {5: 101.0}}, r"must be in \[-100, 100\]"),
        ({"min_tokens": 10, "max_tokens": 4}, r"min_tokens \(10\) must be at most max_tokens"),
    ],
)
def test_processing_values_out_of_range_are_refused(sampling, words):
    with pytest.raises(InvalidRequest, match=words):
        from_proto(generate(**sampling))


def test_neutral_values_are_not_refused():
    message = generate(n=1, repetition_penalty=1.0, temperature=0.7, top_p=0.9, top_k=5)
    assert unsupported_fields(message) == []
    message.data_parallel_rank = 0
    assert unsupported_fields(message) == []
    message.data_parallel_rank = 1
    assert unsupported_fields(message) == ["data_parallel_rank"]


def test_bad_values_and_missing_input_are_invalid(tokenizer):
    with pytest.raises(InvalidRequest, match="top_p"):
        from_proto(generate(top_p=1.5))
    with pytest.raises(InvalidRequest, match="out of range"):
        from_proto(pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[9999])))
    with pytest.raises(InvalidRequest, match="no prompt"):
        from_proto(pb.GenerateRequest())
    with pytest.raises(InvalidRequest, match="--tokenizer"):
        from_proto(pb.GenerateRequest(text="hi"))
    req = from_proto(pb.GenerateRequest(text="def f"), tokenizer)
    assert req.prompt_ids == tokenizer.encode("def f").ids


@pytest.mark.parametrize("seed", [-1, -5, -(2**31)])
def test_a_negative_seed_is_refused_by_name_before_the_engine(seed):
    with pytest.raises(
        InvalidRequest, match=rf"seed must be an integer in \[0, 2\^64 - 1\], got {seed}"
    ):
        from_proto(generate(seed=seed))


def test_stop_token_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(InvalidRequest, match=r"stop_token_ids \[4096, 70000\] are out of range"):
        from_proto(generate(stop_token_ids=[70000, 3, 4096]))


def test_request_ids_live_in_their_callers_scope():
    req = from_proto(generate(), scope="vllm:3f2a")
    assert req.request_id == "vllm:3f2a/r1" and req.client_request_id == "r1"
    with pytest.raises(InvalidRequest, match="request_id has 257 characters"):
        from_proto(
            pb.GenerateRequest(request_id="x" * 257, tokenized=pb.TokenizedInput(input_ids=[5]))
        )


def test_a_text_too_long_to_fit_is_refused_before_it_is_tokenised(tokenizer):
    class Untouchable:
        def __init__(self) -> None:
            self.vocab = tokenizer.get_vocab(with_added_tokens=True)

        def get_vocab(self, with_added_tokens=True):
            return self.vocab

        def encode_batch(self, *args, **kwargs):
            raise AssertionError("tokenised a prompt that cannot fit")

    encoder = PromptEncoder(Untouchable(), None, ENGINE.limits.max_model_len)
    text = "a" * (encoder.max_chars + 1)
    with pytest.raises(InvalidRequest, match=f"the prompt has {len(text)} characters"):
        asyncio.run(request_from_proto(pb.GenerateRequest(text=text), ENGINE, encoder))


def test_stop_strings_cut_at_the_token_that_completes_the_first_match(tokenizer):
    text = "def add(a, b):\n    return a + b\n"
    ids = tokenizer.encode(text).ids
    stops = StopStrings(["return", "zzz"], tokenizer)
    total = 0
    for start in range(0, len(ids), 3):  # three tokens a step, as a speculative step gives
        total += stops.update(ids[start : start + 3])
        if stops.matched:
            break
    assert stops.matched == "return"
    assert "return" in tokenizer.decode(ids[:total])
    assert "return" not in tokenizer.decode(ids[: total - 1])
    # As vLLM: no stop string ends the output before min_tokens tokens; one completed
    # earlier does not match later.
    first = next(n for n in range(1, len(ids) + 1) if "return" in tokenizer.decode(ids[:n]))
    held = StopStrings(["return"], tokenizer, min_tokens=first + 1)
    assert held.update(ids[: first + 1]) == first + 1 and held.matched is None
    none = StopStrings([], None)
    assert none.update(ids) == len(ids) and none.matched is None
    with pytest.raises(InvalidRequest, match="empty"):
        StopStrings([""], tokenizer)


def test_tokenizer_archive_holds_the_tokenizer_files():
    data = tokenizer_archive(str(TINY_TARGET))
    names = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
    assert {"tokenizer.json", "tokenizer_config.json", "config.json"} <= names
    assert (
        hashlib.sha256(data).hexdigest()
        == hashlib.sha256(tokenizer_archive(str(TINY_TARGET))).hexdigest()
    )


def test_logprobs_map_onto_the_gateways_messages():
    lp = [
        common_pb2.TokenLogprobs(logprob=-0.5, top_token_ids=[7, 3], top_logprobs=[-0.5, -1.0]),
        common_pb2.TokenLogprobs(logprob=-2.0, top_token_ids=[1, 4], top_logprobs=[-0.1, -2.5]),
    ]
    out = output_logprobs([7, 4], lp)
    assert list(out.token_logprobs) == [-0.5, -2.0] and list(out.token_ids) == [7, 4]
    assert list(out.top_logprobs[1].token_ids) == [1, 4]
    assert output_logprobs([7], None) is None
    prompt = input_logprobs([9, 7, 4], lp)  # the first prompt token has no logprob
    assert not prompt.token_logprobs[0].HasField("value")
    assert [t.value for t in prompt.token_logprobs[1:]] == [-0.5, -2.0]
    assert list(prompt.token_ids) == [9, 7, 4] and len(prompt.top_logprobs) == 3


def test_non_streamed_completes_leave_in_the_order_of_their_samples():
    def complete(index: int) -> pb.GenerateResponse:
        return pb.GenerateResponse(complete=pb.GenerateComplete(index=index))

    order = InIndexOrder()
    sent = [order.release(i, complete(i)) for i in (2, 0, 3, 1)]
    indices = [[m.complete.index for m in batch] for batch in sent]
    # Sample 2 ends first and waits for 0 and 1; 3 waits for 1.
    assert indices == [[], [0], [], [1, 2, 3]]
