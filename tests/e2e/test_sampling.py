"""Sampled speculative output follows the target's exact distribution; a seed reproduces it.

Every sample is compared with the distribution the target itself gives at that position
(transformers on the bundled target, given the sample's own prefix), for several prompts
and settings, seeded and unseeded; the target served from its float32 folder, and as a GGUF
whose linears stay in Q8_0 / Q4_1 / Q4_0 blocks (transformers dequantising the same file).
Positions 1-3 are decided by chain rejection sampling (an accepted proposal, the residual
after a rejection, or the bonus token); position 0 is the target's own sample after the
prefill.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from e2e_stack import TARGET, running_stack
from gguf_files import MIXED_TYPES, write_gguf
from sampling_stats import (
    categorical_fit_pvalue,
    rank_categories,
    repeat_categories,
    token_categories,
)

from specdec.client import Completion, GenerateParams, generate_concurrently
from specdec.kernels.sampling import logits_to_probs
from specdec.runtime.loader import load_hf_model

SPEC_CONFIG = '{"num_speculative_tokens": 3}'
NUM_SAMPLES = 960  # per setting and seeding
NUM_NEW = 4  # positions 0..3
NUM_BINS = 6  # ranks 0-4 under the exact distribution, and the rest
NUM_PAIR_BINS = 25  # the 24 likeliest (previous token, token) pairs, and the rest
P_MIN = 1e-5  # a shared draft/target stream scores below 1e-30 here
SETTINGS = {
    "T0.8-topk8": GenerateParams(temperature=0.8, top_k=8),
    "T1.0-full": GenerateParams(temperature=1.0),
    "T0.7-topp0.9": GenerateParams(temperature=0.7, top_p=0.9),
}
BATCH = 32


def run(address: str, prompts: list[list[int]], params: list[GenerateParams]) -> list[Completion]:
    outs = []
    for i in range(0, len(params), BATCH):
        chunk = params[i : i + BATCH]
        _, batch = generate_concurrently(address, prompts[i : i + BATCH], chunk)
        outs += batch
    return outs


def exact_probs(model, prompt: list[int], outputs: list[list[int]], params) -> torch.Tensor:
    """``[len(outputs), NUM_NEW, V]``: the target's distribution for each output token."""
    logits = exact_logits(model, prompt, outputs)
    flat = logits_to_probs(logits.reshape(-1, logits.shape[-1]), **params)
    return flat.view(len(outputs), NUM_NEW, -1)


def exact_logits(model, prompt: list[int], outputs: list[list[int]]) -> torch.Tensor:
    """``[len(outputs), NUM_NEW, V]``: the target's logits before each output token."""
    with torch.no_grad():
        first = model(torch.tensor([prompt]), use_cache=True)
        cache = first.past_key_values
        cache.batch_repeat_interleave(len(outputs))
        rest = model(torch.tensor([out[:-1] for out in outputs]), cache=cache).logits
    return torch.cat([first.logits[:, -1:].expand(len(outputs), -1, -1), rest], dim=1)


@pytest.fixture(scope="module", params=["float32", "gguf"])
def target(request, tmp_path_factory) -> str:
    """The bundled target as its float32 folder, or as a GGUF in block formats."""
    if request.param == "float32":
        return TARGET
    folder = tmp_path_factory.mktemp("gguf_target")
    return str(write_gguf(Path(TARGET), folder / "target.gguf", MIXED_TYPES))


@pytest.fixture(scope="module")
def target_model(target):
    # The bundled target's activations reach float32 denormals, which make CPU matmuls
    # ~10x slower; flushing them moves no probability by more than 1e-6.
    flushed = torch.set_flush_denormal(True)
    yield load_hf_model(target)
    if flushed:
        torch.set_flush_denormal(False)


@pytest.fixture(scope="module")
def stack(target):
    config = dict(speculative_config=SPEC_CONFIG, max_num_seqs=BATCH)
    with running_stack(target_model=target, **config) as s:
        yield s


@pytest.fixture(scope="module")
def samples(stack, prompt_ids):
    """setting, seeded -> (prompt per sample, completions)."""
    prompts = [prompt_ids[i % 4][:8] for i in range(NUM_SAMPLES)]
    out = {}
    for s, (name, base) in enumerate(SETTINGS.items()):
        for seeded in (True, False):
            params = [
                replace(
                    base,
                    max_tokens=NUM_NEW,
                    ignore_eos=True,
                    seed=s * NUM_SAMPLES + i if seeded else None,
                )
                for i in range(NUM_SAMPLES)
            ]
            out[name, seeded] = prompts, run(stack.address, prompts, params)
    return out


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "unseeded"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sampled_output_follows_the_targets_exact_distribution(
    samples, target_model, setting, seeded
):
    prompts, outs = samples[setting, seeded]
    assert_exact(target_model, prompts, outs, SETTINGS[setting])
    # Every path of the sampler ran: accepted proposals, residual resamples after a
    # rejection, and the bonus token after a fully accepted step (K = 2 after the prefill).
    stats = [o.stats for o in outs]
    assert sum(s["num_accepted_tokens"] for s in stats) > NUM_SAMPLES // 4
    assert sum(s["num_accepted_tokens"] < s["num_draft_tokens"] for s in stats) > 50
    assert sum(s["num_drafts"] == 1 and s["num_accepted_tokens"] == 2 for s in stats) > 20


def test_drafts_cut_by_draft_p_min_keep_the_exact_distribution(target, target_model, prompt_ids):
    """The draft stops proposing where its own distribution is flat (--draft-p-min): the
    stopping point depends on the draft alone, so verification stays exact."""
    prompts = [prompt_ids[i % 4][:8] for i in range(NUM_SAMPLES)]
    base = SETTINGS["T1.0-full"]
    params = [replace(base, max_tokens=NUM_NEW, ignore_eos=True) for _ in prompts]
    config = dict(speculative_config=SPEC_CONFIG, max_num_seqs=BATCH, draft_p_min=0.3)
    with running_stack(target_model=target, **config) as stack:
        outs = run(stack.address, prompts, params)
    assert_exact(target_model, prompts, outs, base)
    stats = [o.stats for o in outs]
    # Some drafts were cut to nothing (a decode step verified without proposals, which K = 3
    # never asks for), and many were not.
    assert sum(s["num_k0_steps"] > 0 for s in stats) > 50
    assert sum(s["num_drafts"] > 0 for s in stats) > NUM_SAMPLES // 2
    assert sum(s["num_accepted_tokens"] for s in stats) > NUM_SAMPLES // 8


def test_a_feature_reading_draft_keeps_the_exact_distribution(
    target, target_model, prompt_ids, bundled_feature_draft
):
    """Proposals drawn by a draft that reads the target's features (its q depends on them):
    verification is the same, so the output keeps the target's distribution."""
    prompts = [prompt_ids[i % 4][:8] for i in range(NUM_SAMPLES)]
    base = SETTINGS["T1.0-full"]
    params = [replace(base, max_tokens=NUM_NEW, ignore_eos=True) for _ in prompts]
    config = dict(speculative_config=SPEC_CONFIG, max_num_seqs=BATCH)
    with running_stack(target_model=target, draft_model=bundled_feature_draft, **config) as stack:
        outs = run(stack.address, prompts, params)
    assert_exact(target_model, prompts, outs, base)
    stats = [o.stats for o in outs]
    assert sum(s["num_accepted_tokens"] for s in stats) > NUM_SAMPLES // 8
    assert sum(s["num_accepted_tokens"] < s["num_draft_tokens"] for s in stats) > 50


def assert_exact(target_model, prompts, outs, base: GenerateParams) -> None:
    params = dict(temperature=base.temperature, top_k=base.top_k, top_p=base.top_p)
    probs = torch.empty(len(outs), NUM_NEW, target_model.config.vocab_size)
    for prompt in {tuple(p) for p in prompts}:
        rows = [i for i, p in enumerate(prompts) if tuple(p) == prompt]
        probs[rows] = exact_probs(
            target_model, list(prompt), [outs[i].token_ids for i in rows], params
        )
    assert_fits(prompts, outs, probs)


def assert_fits(prompts, outs, probs: torch.Tensor) -> None:
    """Every sampled token fits ``probs`` ``[samples, NUM_NEW, V]``, its exact distribution."""
    # Each token is tested given its prefix three ways: by its rank under the exact
    # distribution, as a (previous token, token) pair, and as a repeat of the previous token.
    tokens = torch.tensor([[p[-1], *o.token_ids] for p, o in zip(prompts, outs, strict=True)])
    pvalues = []
    for pos in range(1, NUM_NEW + 1):
        exact, previous, token = probs[:, pos - 1], tokens[:, pos - 1], tokens[:, pos]
        pvalues.append(categorical_fit_pvalue(*rank_categories(exact, token, NUM_BINS)))
        pairs = token_categories(exact, token, previous, NUM_PAIR_BINS)
        pvalues.append(categorical_fit_pvalue(*pairs))
        pvalues.append(categorical_fit_pvalue(*repeat_categories(exact, token, previous)))
    shown = " ".join(f"{p:.1e}" for p in pvalues)
    assert min(pvalues) > P_MIN, f"p-values (rank, pair, repeat) x positions 1-4: {shown}"


# Logits processing inside the chain (positions 1-3 are decided by rejection sampling after
# proposals the same chain drew): each setting strong enough to move the distribution.
PROCESSED = {
    "presence-frequency": GenerateParams(temperature=1.0, presence_penalty=1.5,
                                         frequency_penalty=1.0),
    "repetition": GenerateParams(temperature=1.0, repetition_penalty=2.0),
    "min_p": GenerateParams(temperature=1.0, min_p=0.05),
    "logit_bias": GenerateParams(temperature=1.0, logit_bias=((12, 3.0), (60, 2.0), (286, -100.0))),
}  # fmt: skip
NUM_PROCESSED = 1024


@pytest.mark.parametrize("name", list(PROCESSED))
def test_processed_sampling_keeps_the_exact_distribution(stack, target_model, prompt_ids, name):
    """Against an independent reference of the processing (vLLM's meanings, written out
    token by token): a penalty at position i counts the prompt and the outputs before i,
    the proposals of the same chain included."""
    prompts = [prompt_ids[i % 4][:8] for i in range(NUM_PROCESSED)]
    base = PROCESSED[name]
    params = [replace(base, max_tokens=NUM_NEW, ignore_eos=True) for _ in prompts]
    outs = run(stack.address, prompts, params)
    probs = torch.empty(len(outs), NUM_NEW, target_model.config.vocab_size)
    for prompt in {tuple(p) for p in prompts}:
        rows = [i for i, p in enumerate(prompts) if tuple(p) == prompt]
        logits = exact_logits(target_model, list(prompt), [outs[i].token_ids for i in rows])
        for row, i in enumerate(rows):
            for pos in range(NUM_NEW):
                before = outs[i].token_ids[:pos]
                probs[i, pos] = reference_probs(logits[row, pos], list(prompt), before, base)
    assert_fits(prompts, outs, probs)
    stats = [o.stats for o in outs]
    assert sum(s["num_accepted_tokens"] for s in stats) > NUM_PROCESSED // 8


def reference_probs(logits: torch.Tensor, prompt: list[int], before: list[int], p) -> torch.Tensor:
    """The distribution after ``prompt`` and the outputs ``before``, processed in vLLM's
    order one token at a time: logit_bias, repetition, frequency and presence penalties,
    temperature, min_p."""
    row = logits.double().clone()
    for token, bias in p.logit_bias:
        row[token] += bias
    for token in set(prompt) | set(before):
        value = float(row[token])
        row[token] = value / p.repetition_penalty if value > 0 else value * p.repetition_penalty
    for token in set(before):
        row[token] -= p.frequency_penalty * before.count(token) + p.presence_penalty
    probs = torch.softmax(row / p.temperature, dim=-1)
    probs[probs < p.min_p * probs.max()] = 0.0
    return (probs / probs.sum()).float()
