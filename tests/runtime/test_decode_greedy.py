"""Greedy decoding in one C call (ModelRunner.decode_greedy) picks the tokens, and leaves
the KV cache, that extend + argmax one forward at a time would."""

from __future__ import annotations

import pytest
import torch
from test_head_subset import with_subset_head

from specdec.runtime import ModelRunner, SequenceChunk

PROMPTS = {"a": list(range(3, 22)), "b": [9, 4, 7, 30, 2]}
STEPS = 13  # crosses several 4-token pages


def runner_for(path, **overrides) -> ModelRunner:
    config = dict(num_pages=64, page_size=4, attention_backend="cpu", max_model_len=64)
    return ModelRunner.from_pretrained(path, **{**config, **overrides})


def prefill(runner: ModelRunner) -> list[int]:
    """Opens and prefills every prompt; returns each one's first greedy token."""
    for seq_id in PROMPTS:
        runner.open(seq_id)
    chunks = [SequenceChunk(s, p) for s, p in PROMPTS.items()]
    return [int(out[-1].argmax()) for out in runner.extend(chunks)]


def one_forward_at_a_time(runner: ModelRunner, first: list[int]):
    """Each sequence's STEPS greedy picks, and each pick's probability."""
    tokens, picks, probs = first, [[] for _ in PROMPTS], [[] for _ in PROMPTS]
    for _ in range(STEPS):
        outs = runner.extend([SequenceChunk(s, [t]) for s, t in zip(PROMPTS, tokens, strict=True)])
        tokens = [int(out[-1].argmax()) for out in outs]
        for n, out in enumerate(outs):
            picks[n].append(tokens[n])
            probs[n].append(float(torch.softmax(out[-1], -1).max()))
    return picks, probs


def first_below(probs: list[float], threshold: float) -> int:
    return next((i for i, p in enumerate(probs) if p < threshold), len(probs))


def next_logits(runner: ModelRunner, picks: list[list[int]]) -> torch.Tensor:
    """Logits of one more forward: equal only if the cached KV is."""
    outs = runner.extend([SequenceChunk(s, [p[-1]]) for s, p in zip(PROMPTS, picks, strict=True)])
    return torch.cat(outs)


@pytest.mark.parametrize(
    "weights",
    [{"dtype": "float32"}, {"dtype": "float16"}, {"quantization": "int8"}],
    ids=["float32", "float16", "int8"],
)
@pytest.mark.parametrize("head", ["full", "subset"])
def test_one_c_call_picks_what_extend_and_argmax_pick(tmp_path, tiny_checkpoint, weights, head):
    path = tiny_checkpoint(tmp_path / "full", "llama", tie_word_embeddings=False)
    if head == "subset":  # a frequency-ranked head: rows in no particular id order
        ids = torch.randperm(256, generator=torch.Generator().manual_seed(3))[:96].tolist()
        path = with_subset_head(path, tmp_path / "subset", ids, tied=False)
    stepwise, native = runner_for(path, **weights), runner_for(path, **weights)
    first = prefill(stepwise)
    assert prefill(native) == first
    expected, _ = one_forward_at_a_time(stepwise, first)
    picks = native.decode_greedy(list(PROMPTS), first, STEPS)
    assert picks == expected
    if head == "subset":
        assert all(t in ids for p in picks for t in p)
    for seq_id, prompt in PROMPTS.items():
        assert native.seq_len(seq_id) == stepwise.seq_len(seq_id) == len(prompt) + STEPS
    assert torch.equal(next_logits(native, picks), next_logits(stepwise, picks))


@pytest.mark.parametrize(
    "overrides", [{"kv_cache_dtype": "fp8"}, {"attention_backend": "reference"}], ids=str
)
def test_where_the_c_loop_does_not_apply_nothing_changes(tiny_model_path, overrides):
    runner = runner_for(tiny_model_path, **overrides)
    first = prefill(runner)
    assert runner.decode_greedy(list(PROMPTS), first, STEPS) is None
    assert [runner.seq_len(s) for s in PROMPTS] == [len(p) for p in PROMPTS.values()]


def test_a_sequence_that_would_pass_max_model_len_fails_the_call_and_changes_nothing(
    tiny_model_path,
):
    runner = runner_for(tiny_model_path, max_model_len=len(PROMPTS["a"]) + STEPS - 1)
    first = prefill(runner)
    with pytest.raises(ValueError, match="max_model_len"):
        runner.decode_greedy(list(PROMPTS), first, STEPS)
    assert [runner.seq_len(s) for s in PROMPTS] == [len(p) for p in PROMPTS.values()]


def test_min_prob_stops_each_sequence_before_its_first_unlikely_pick(tiny_checkpoint, tmp_path):
    path = tiny_checkpoint(tmp_path / "llama", "llama")
    stepwise, native = runner_for(path), runner_for(path)
    first = prefill(stepwise)
    prefill(native)
    picks, probs = one_forward_at_a_time(stepwise, first)
    # A threshold halfway between two probabilities (far from both, so float rounding in
    # the C loop cannot move it) that stops the two sequences after different picks.
    ranked = sorted({p for ps in probs for p in ps})
    midpoints = [(a + b) / 2 for a, b in zip(ranked, ranked[1:], strict=False) if b - a > 1e-4]
    threshold, cuts = next(
        (t, cuts)
        for t in midpoints
        if min(cuts := [first_below(ps, t) for ps in probs]) > 0 and min(cuts) < max(cuts) < STEPS
    )
    got = native.decode_greedy(list(PROMPTS), first, STEPS, min_prob=threshold)
    assert got == [p[:c] for p, c in zip(picks, cuts, strict=True)]
    for (seq_id, prompt), cut in zip(PROMPTS.items(), cuts, strict=True):
        assert native.seq_len(seq_id) == len(prompt) + cut
        stepwise.truncate(seq_id, len(prompt) + cut)
    assert torch.equal(next_logits(native, got), next_logits(stepwise, got))


def test_min_prob_from_keeps_the_first_picks_whatever_their_probability(tiny_model_path):
    stepwise, native = runner_for(tiny_model_path), runner_for(tiny_model_path)
    first = prefill(stepwise)
    prefill(native)
    picks, probs = one_forward_at_a_time(stepwise, first)
    assert all(ps[0] < 0.9999 for ps in probs)  # every first pick would be cut
    assert native.decode_greedy(list(PROMPTS), first, STEPS, 0.9999) == [[], []]
    kept = native.decode_greedy(list(PROMPTS), first, STEPS, 0.9999, min_prob_from=1)
    assert kept == [p[:1] for p in picks]
    for seq_id, prompt in PROMPTS.items():
        assert native.seq_len(seq_id) == len(prompt) + 1  # the fed token; the pick is not
        stepwise.truncate(seq_id, len(prompt) + 1)
    assert torch.equal(next_logits(native, kept), next_logits(stepwise, kept))
