"""A model that reads the target's features (``reads_target_features``): the C kernels and
the PyTorch reference agree, the features change the output, and ``forward_chunks`` returns
the hidden states asked for, of the tokens it computed."""

from __future__ import annotations

import torch

from specdec.runtime.model_runner import ModelRunner
from specdec.runtime.sequence import SequenceChunk

TOKENS = [5, 17, 99, 3, 250, 61, 7, 42, 42, 8, 1, 77]


def run(runner: ModelRunner, features, seq="s"):
    runner.open(seq)
    chunk = SequenceChunk(seq, TOKENS, 2, len(TOKENS), features)
    return runner.forward_chunks([chunk])[0]


def test_feature_input_in_c_equals_the_reference(tiny_feature_draft_path):
    features = torch.randn(len(TOKENS), 64, generator=torch.Generator().manual_seed(0))
    native = ModelRunner.from_pretrained(tiny_feature_draft_path, attention_backend="cpu")
    reference = ModelRunner.from_pretrained(tiny_feature_draft_path, attention_backend="reference")
    assert native.cpu_kernels and native.model_config.reads_target_features
    a, b = run(native, features), run(reference, features)
    assert a.hidden.shape == (len(TOKENS), 64) and a.logits.shape[0] == 2
    torch.testing.assert_close(a.hidden, b.hidden, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)
    # Features are part of the input: none (zeros) gives other states.
    zeros = run(reference, None, seq="z")
    assert not torch.allclose(zeros.hidden, b.hidden, atol=1e-2)
    assert not native.decodes_greedy_in_c  # each greedy pick reads the one before


def test_hidden_rows_of_a_prefix_cache_hit_are_only_those_computed(tiny_feature_draft_path):
    runner = ModelRunner.from_pretrained(
        tiny_feature_draft_path, enable_prefix_caching=True, page_size=4
    )
    first = run(runner, None, seq="a")
    again = run(runner, None, seq="b")
    hits = runner.last_prefix_hits["b"]
    assert hits == 8 and again.hidden.shape[0] == len(TOKENS) - hits
    torch.testing.assert_close(again.hidden, first.hidden[hits:])
