"""Counter-based draws: reproducible per coordinate, uniform, independent across domains."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import kstest, pearsonr

from specdec.kernels.random_stream import DRAFT_DOMAIN, TARGET_DOMAIN, RandomStream

N = 20_000


def test_a_draw_depends_only_on_its_coordinates():
    a, b = RandomStream(42, TARGET_DOMAIN), RandomStream(42, TARGET_DOMAIN)
    assert [a.uniform(p, 1) for p in range(50)] == [b.uniform(p, 1) for p in range(50)]
    assert a.uniform(7, 0) != a.uniform(7, 1) != a.uniform(8, 1)
    assert RandomStream(43, TARGET_DOMAIN).uniform(7, 0) != a.uniform(7, 0)


def test_draws_are_uniform_on_the_open_interval():
    u = RandomStream(1, TARGET_DOMAIN).uniforms(range(N), 0).numpy()
    assert u.min() > 0.0 and u.max() < 1.0
    assert kstest(u, "uniform").pvalue > 1e-4


def test_the_draft_and_the_target_draw_unrelated_values_for_one_seed():
    for seed in (0, 1, 2**63 + 5):
        draft = RandomStream(seed, DRAFT_DOMAIN).uniforms(range(N), 0).numpy()
        target = RandomStream(seed, TARGET_DOMAIN).uniforms(range(N), 0).numpy()
        assert abs(pearsonr(draft, target).statistic) < 0.03
        assert np.mean(np.abs(draft - target) < 1e-9) == 0.0


def test_unseeded_requests_get_fresh_keys_and_negative_seeds_are_valid():
    assert RandomStream.for_request(None, TARGET_DOMAIN) != RandomStream.for_request(
        None, TARGET_DOMAIN
    )
    assert RandomStream.for_request(-1, DRAFT_DOMAIN).key == 2**64 - 1
    assert RandomStream.for_request(5, DRAFT_DOMAIN) == RandomStream(5, DRAFT_DOMAIN)


def test_the_fused_kernel_generator_is_seeded_per_step_position():
    stream = RandomStream(3, TARGET_DOMAIN)
    draws = [
        torch.rand(4, generator=stream.torch_generator(p, torch.device("cpu"))) for p in (5, 5, 6)
    ]
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
