"""The gateway protocol's request mapping, refusals, stop strings and tokenizer bundle."""

from __future__ import annotations

import hashlib
import io
import zipfile
from types import SimpleNamespace

import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from tokenizers import Tokenizer

from coordinator.engine import ModelLimits
from coordinator.errors import InvalidRequest
from coordinator.launcher import TINY_TARGET
from coordinator.vllm_worker import (
    StopStrings,
    request_from_proto,
    tokenizer_archive,
    unsupported_fields,
)
from protos.specdec.v1 import common_pb2

ENGINE = SimpleNamespace(
    limits=ModelLimits(
        vocab_size=4096, max_model_len=2048, eos_token_ids=frozenset({0}),
        draft_kv_scales=common_pb2.KVScaleTable(),
    )
)  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TINY_TARGET / "tokenizer.json"))


def generate(**sampling) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="r1",
        tokenized=pb.TokenizedInput(input_ids=[5, 6, 7]),
        sampling_params=pb.SamplingParams(**sampling),
    )


def test_defaults_follow_vllm():
    req = request_from_proto(generate(), ENGINE, None)
    assert req.sampling.temperature == 1.0  # unset temperature: vLLM's default
    assert req.sampling.top_p == 1.0 and req.sampling.top_k == 0
    assert req.max_tokens == 2048 - 3  # unset max_tokens: the rest of the context
    req = request_from_proto(
        generate(temperature=0, max_tokens=9, seed=4, stop_token_ids=[11], ignore_eos=True),
        ENGINE,
        None,
    )
    assert req.sampling.greedy and req.sampling.seed == 4 and req.max_tokens == 9
    assert req.stop_token_ids == {11} and req.ignore_eos


@pytest.mark.parametrize(
    "sampling, field",
    [
        ({"n": 2}, "sampling_params.n"),
        ({"logprobs": 0}, "sampling_params.logprobs"),
        ({"prompt_logprobs": 1}, "sampling_params.prompt_logprobs"),
        ({"min_p": 0.1}, "sampling_params.min_p"),
        ({"presence_penalty": 0.5}, "sampling_params.presence_penalty"),
        ({"repetition_penalty": 1.2}, "sampling_params.repetition_penalty"),
        ({"min_tokens": 3}, "sampling_params.min_tokens"),
        ({"logit_bias": {3: 1.0}}, "sampling_params.logit_bias"),
        ({"json_schema": "{}"}, "sampling_params.json_schema"),
        ({"regex": "a+"}, "sampling_params.regex"),
    ],
)
def test_what_specdec_cannot_honour_is_refused_by_name(sampling, field):
    message = generate(**sampling)
    assert unsupported_fields(message) == [field]
    with pytest.raises(InvalidRequest, match=field.replace(".", r"\.")):
        request_from_proto(message, ENGINE, None)


def test_neutral_values_are_not_refused():
    message = generate(n=1, repetition_penalty=1.0, temperature=0.7, top_p=0.9, top_k=5)
    assert unsupported_fields(message) == []
    message.data_parallel_rank = 0
    assert unsupported_fields(message) == []
    message.data_parallel_rank = 1
    assert unsupported_fields(message) == ["data_parallel_rank"]


def test_bad_values_and_missing_input_are_invalid(tokenizer):
    with pytest.raises(InvalidRequest, match="top_p"):
        request_from_proto(generate(top_p=1.5), ENGINE, None)
    with pytest.raises(InvalidRequest, match="out of range"):
        request_from_proto(
            pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[9999])), ENGINE, None
        )
    with pytest.raises(InvalidRequest, match="no prompt"):
        request_from_proto(pb.GenerateRequest(), ENGINE, None)
    with pytest.raises(InvalidRequest, match="--tokenizer"):
        request_from_proto(pb.GenerateRequest(text="hi"), ENGINE, None)
    req = request_from_proto(pb.GenerateRequest(text="def f"), ENGINE, tokenizer)
    assert req.prompt_ids == tokenizer.encode("def f").ids


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
