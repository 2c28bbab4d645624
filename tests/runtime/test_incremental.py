"""Incremental = recomputed: chunking, truncation and batching never change the numbers."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import cached_kv, prefill

from specdec.runtime import ModelRunner, SequenceChunk

TOKENS = [(7 * i + 3) % 256 for i in range(45)]
TOL = 1e-5


@pytest.fixture(params=["cpu", "reference"])
def runner(request, qwen3_path):
    return ModelRunner.from_pretrained(
        qwen3_path, num_pages=64, page_size=4, attention_backend=request.param
    )


def test_kv_after_many_small_extends_equals_one_prefill(runner):
    prefill(runner, "whole", TOKENS)
    runner.open("pieces")
    logits = []
    start = 0
    for size in [5, 1, 3, 1, 7, 1, 1, 10, 2, 14]:
        chunk = TOKENS[start : start + size]
        logits.append(runner.extend([SequenceChunk("pieces", chunk, num_logits=size)])[0])
        start += size
    assert start == len(TOKENS)
    assert runner.seq_len("pieces") == runner.seq_len("whole") == len(TOKENS)
    whole_kv, pieces_kv = cached_kv(runner, "whole"), cached_kv(runner, "pieces")
    assert whole_kv.abs().max() > 0.1
    assert (whole_kv - pieces_kv).abs().max().item() < TOL
    # ... and so are the logits at every position.
    runner.release("whole")
    ref = prefill(runner, "whole", TOKENS)
    assert (torch.cat(logits) - ref).abs().max().item() < TOL


def test_truncate_then_extend_equals_never_extended(runner):
    prefix, rejected, accepted = TOKENS[:20], [100, 101, 102, 103, 104, 105], [42, 43]
    prefill(runner, "a", prefix)
    runner.extend([SequenceChunk("a", rejected, num_logits=6)])
    free_before_truncate = runner.num_free_pages
    runner.truncate("a", len(prefix))
    assert runner.seq_len("a") == len(prefix)
    assert runner.num_free_pages == free_before_truncate + 2  # 7 pages of 4 -> 5 pages
    got = runner.extend([SequenceChunk("a", accepted, num_logits=2)])[0]

    prefill(runner, "b", prefix)
    want = runner.extend([SequenceChunk("b", accepted, num_logits=2)])[0]
    assert (got - want).abs().max().item() < TOL
    assert (cached_kv(runner, "a") - cached_kv(runner, "b")).abs().max().item() < TOL


def test_ragged_batch_gives_each_sequence_its_solo_logits(runner):
    # Solo runs.
    prefill(runner, "p", TOKENS[:9])
    prefill(runner, "d", TOKENS[10:30])
    prefill(runner, "v", TOKENS[:17])
    prefill(runner, "n", TOKENS[5:12])
    chunks = [
        SequenceChunk("p", TOKENS[9:25], num_logits=1),  # next prefill chunk
        SequenceChunk("d", [77], num_logits=1),  # decode
        SequenceChunk("v", [TOKENS[17], 1, 2, 3, 4], num_logits=5),  # 1 + K verify
        SequenceChunk("n", [9, 9, 9], num_logits=0),  # prefill chunk, no logits wanted
    ]
    solo = [runner.extend([c])[0] for c in chunks]
    solo_kv = {s: cached_kv(runner, s) for s in "pdvn"}
    for s in "pdvn":
        runner.release(s)

    # The same state, then one mixed batch.
    prefill(runner, "p", TOKENS[:9])
    prefill(runner, "d", TOKENS[10:30])
    prefill(runner, "v", TOKENS[:17])
    prefill(runner, "n", TOKENS[5:12])
    batched = runner.extend(chunks)
    assert [tuple(t.shape) for t in batched] == [(1, 256), (1, 256), (5, 256), (0, 256)]
    for got, want in zip(batched, solo, strict=True):
        torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    for s in "pdvn":
        assert (cached_kv(runner, s) - solo_kv[s]).abs().max().item() < TOL


def test_empty_and_zero_logit_chunks(runner):
    runner.open("a")
    out = runner.extend([SequenceChunk("a", [], num_logits=0)])
    assert len(out) == 1 and out[0].shape == (0, 256)
    assert runner.seq_len("a") == 0
    out = runner.extend([SequenceChunk("a", [1, 2, 3], num_logits=0)])
    assert out[0].shape == (0, 256) and runner.seq_len("a") == 3
