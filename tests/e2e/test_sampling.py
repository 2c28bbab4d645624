"""Sampled speculative decoding follows the target's distribution; a seed reproduces it."""

from __future__ import annotations

from collections import Counter

import pytest
from e2e_stack import running_stack
from scipy.stats import chi2_contingency

from coordinator.client import GenerateParams, generate_concurrently

NUM_SAMPLES = 400
TOP_K = 4
PROMPT = "import os\nimport sys\n\n\ndef main("


def sampled(address: str, seeds: range, top_k: int = 0) -> list[tuple[int, ...]]:
    params = [
        GenerateParams(max_tokens=3, temperature=1.0, top_k=top_k, seed=s, ignore_eos=True)
        for s in seeds
    ]
    outs = []
    for i in range(0, len(params), 16):
        chunk = params[i : i + 16]
        _, batch = generate_concurrently(address, [PROMPT] * len(chunk), chunk)
        outs += [tuple(o.token_ids) for o in batch]
    return outs


def contingency(a: list, b: list, min_count: int = 10) -> list[list[int]]:
    """Rows: categories seen at least min_count times in a + b, the rest pooled."""
    ca, cb = Counter(a), Counter(b)
    common = [x for x in ca | cb if ca[x] + cb[x] >= min_count]
    rows = [[ca[x], cb[x]] for x in common]
    rows.append([len(a) - sum(r[0] for r in rows), len(b) - sum(r[1] for r in rows)])
    return [r for r in rows if sum(r) > 0]


@pytest.fixture(scope="module")
def samples():
    spec_config = '{"num_speculative_tokens": 3}'
    with running_stack(speculative_config=spec_config, with_baseline=True) as stack:
        # top_k keeps the bundled model's flat distribution (~5 nats) to a testable
        # number of categories; p and q are both restricted, as in serving.
        spec = sampled(stack.address, range(NUM_SAMPLES), TOP_K)
        target_only = sampled(stack.baseline_address, range(NUM_SAMPLES, 2 * NUM_SAMPLES), TOP_K)
        full_vocab = sampled(stack.address, range(16))
        again = sampled(stack.address, range(8))
    return spec, target_only, full_vocab, again


def test_sampled_tokens_follow_the_target_only_distribution(samples):
    spec, target_only, _, _ = samples
    # Token 0 comes from the prefill; tokens 1 and 2 are the first decided by rejection
    # sampling. Compare each position's distribution and the joint of the first two.
    for key in (lambda s: s[0], lambda s: s[1], lambda s: s[2], lambda s: s[:2]):
        table = contingency([key(s) for s in spec], [key(s) for s in target_only])
        assert len(table) >= 3, "the distribution is too peaked to test"
        assert chi2_contingency(table).pvalue > 1e-3


def test_a_seed_reproduces_sampled_output(samples):
    _, _, full_vocab, again = samples
    assert again == full_vocab[:8]
    assert len(set(full_vocab)) > 8  # and different seeds give different outputs
