"""The SmolLM2 draft's frequency-ranked head as ``scripts/train_draft.py`` chooses and
re-chooses it (``head_token_ids``, ``resize_head``)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from draft_teacher import TeacherSequence
from torch import nn
from train_draft import head_token_ids, resize_head


def answer(prompt: list[int], tokens: list[int]) -> TeacherSequence:
    ids = prompt + tokens
    return TeacherSequence(
        token_ids=ids,
        prompt_len=len(prompt),
        top_ids=torch.zeros(len(ids) - 1, 1, dtype=torch.int32),
        top_logprobs=torch.zeros(len(ids) - 1, 1, dtype=torch.float16),
        sampled=False,
    )


def test_the_head_takes_the_ids_most_frequent_in_the_answers_then_in_the_prompts():
    data = [answer([9, 9, 9, 8], [5, 5, 5, 6, 6, 7]), answer([8], [6, 5])]
    # 5 (4 answers) and 6 (3) first, then 7 (1 answer); 9 beats 8 in the prompts (3 to 2).
    assert head_token_ids(data, 6, special=[0]) == [0, 5, 6, 7, 8, 9]
    assert head_token_ids(data, 3, special=[0]) == [0, 5, 6]
    # Kept ids come first, whatever their frequency.
    assert head_token_ids(data, 3, special=[0], keep=[3]) == [0, 3, 5]


def test_a_rechosen_head_keeps_the_trained_rows_of_the_ids_it_keeps():
    embedding = torch.arange(10 * 4, dtype=torch.float32).reshape(10, 4)
    trained = torch.randn(3, 4)
    model = SimpleNamespace(lm_head=nn.Linear(4, 3, bias=False))
    model.lm_head.weight.data = trained.clone()
    config = {"head_token_ids": [1, 4, 7]}
    resize_head(model, config, {"model.embed_tokens.weight": embedding}, [2, 4, 7, 8])
    weight = model.lm_head.weight.data
    assert config["head_token_ids"] == [2, 4, 7, 8]
    assert torch.equal(weight[1], trained[1]) and torch.equal(weight[2], trained[2])
    assert torch.equal(weight[0], embedding[2]) and torch.equal(weight[3], embedding[8])
