"""Chat prompts: the target's chat template, rendered as transformers renders it."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from coordinator_fakes import build
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from specdec.coordinator.api.chat import ChatTemplate
from specdec.coordinator.engine.core import ModelLimits
from specdec.coordinator.engine.errors import InvalidRequest
from specdec.v1 import common_pb2, coordinator_pb2

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHAT = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3 + 3, in words? «quote»"},
]
LIMITS = ModelLimits(
    vocab_size=1000, max_model_len=4096, eos_token_ids=frozenset({2}),
    draft_kv_scales=common_pb2.KVScaleTable(),
)  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat_tokenizer")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.save(str(path / "tokenizer.json"))
    config = {"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_the_template_renders_like_transformers_apply_chat_template(folder):
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )
    template = ChatTemplate.from_pretrained(str(folder))
    assert template.render(CHAT) == expected
    assert template.render(CHAT[1:2]).startswith("<|im_start|>system\nYou are a helpful")


def test_a_messages_prompt_is_the_rendered_template_tokenised_with_special_tokens(folder):
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    template = ChatTemplate.from_pretrained(str(folder))
    message = coordinator_pb2.GenerateRequest(
        messages=coordinator_pb2.ChatMessages(
            messages=[coordinator_pb2.ChatMessage(**m) for m in CHAT]
        )
    )
    req = build(LIMITS, message, tokenizer, template)
    rendered = template.render(CHAT)
    assert req.prompt_ids == tokenizer.encode(rendered, add_special_tokens=False).ids
    assert req.prompt_ids.count(tokenizer.token_to_id("<|im_start|>")) == 5


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([], "messages is empty"),
        ([{"role": "robot", "content": "hi"}], "messages[0].role is 'robot'"),
    ],
)
def test_bad_messages_are_invalid_requests_naming_the_field(folder, messages, error):
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    message = coordinator_pb2.GenerateRequest(
        messages=coordinator_pb2.ChatMessages(
            messages=[coordinator_pb2.ChatMessage(**m) for m in messages]
        )
    )
    with pytest.raises(InvalidRequest, match=error.replace("[", r"\[").replace("]", r"\]")):
        build(LIMITS, message, tokenizer, ChatTemplate.from_pretrained(str(folder)))


def test_messages_without_a_chat_template_are_refused(folder, tmp_path):
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert ChatTemplate.from_pretrained(str(tmp_path)) is None
    message = coordinator_pb2.GenerateRequest(
        messages=coordinator_pb2.ChatMessages(messages=[coordinator_pb2.ChatMessage(**CHAT[1])])
    )
    with pytest.raises(InvalidRequest, match="chat template"):
        build(LIMITS, message, tokenizer, None)


def test_templates_get_transformers_loop_controls_and_strftime_now():
    source = (
        "{{ strftime_now('%Y') }}|{% for m in messages %}{% if m['role'] == 'system' %}"
        "{% continue %}{% endif %}{{ m['content'] }};{% if loop.index > 2 %}{% break %}"
        "{% endif %}{% endfor %}"
    )
    rendered = ChatTemplate(source, {}).render(CHAT)
    year, body = rendered.split("|")
    assert year == str(datetime.now().year)
    assert body == "What is 2 + 2?;4.;"  # the system turn skipped, the fourth never reached
