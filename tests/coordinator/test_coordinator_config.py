"""Speculative config parsing and the CLI built from the config dataclass."""

from __future__ import annotations

import argparse
import json

import pytest

from specdec.config import TINY_DRAFT, TINY_TARGET, StackConfig, draft_speculation
from specdec.coordinator.engine.config import (
    DEFAULT_SPECULATIVE_CONFIG,
    CoordinatorConfig,
    SpeculativeConfig,
)
from specdec.flags import add_flags, from_args


def test_per_batch_size_table_is_inclusive_and_uncovered_sizes_run_k0():
    spec = SpeculativeConfig.from_json(
        '{"num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 2, 0], [4, 8, 2]]}'
    )
    assert [spec.k_for_batch_size(bs) for bs in range(1, 10)] == [3, 0, 0, 2, 2, 2, 2, 2, 0]
    assert spec.max_k == 3


def test_prompt_lookup_keys_are_vllms_and_off_by_default():
    spec = SpeculativeConfig.from_json(
        '{"num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
    )
    assert spec.prompt_lookup == (2, 4)
    assert SpeculativeConfig.from_json('{"num_speculative_tokens": 5}').prompt_lookup == (0, 0)


def test_fixed_k_and_empty_config():
    assert SpeculativeConfig.from_json('{"num_speculative_tokens": 5}').k_for_batch_size(9) == 5
    assert SpeculativeConfig.from_json("").k_for_batch_size(1) == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[1]", "JSON object"),
        ('{"num_speculative_tokens": -1}', ">= 0"),
        ('{"num_speculative_tokens": 2.5}', ">= 0"),
        ('{"num_speculative_tokens_per_batch_size": [[1, 2]]}', "[min_bs, max_bs, K]"),
        ('{"num_speculative_tokens_per_batch_size": [[1, 2, "3"]]}', "[min_bs, max_bs, K]"),
        ('{"num_speculative_tokens_per_batch_size": [[3, 2, 1]]}', "min_bs must be <= max_bs"),
        ('{"num_speculative_tokens_per_batch_size": [[0, 2, 1]]}', "min_bs must be >= 1"),
        ('{"num_speculative_tokens_per_batch_size": [[1, 2, -1]]}', "K must be >= 0"),
        ('{"num_speculative_tokens_per_batch_size": [[1, 4, 3], [4, 8, 1]]}', "overlap"),
        ('{"num_speculative_tokens_per_batch_size": 3}', "list of rows"),
        (
            '{"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 1, 3]]}',
            "more tokens than num_speculative_tokens=2",
        ),
        ('{"num_speculative_token": 2}', "unknown keys"),
        ('{"prompt_lookup_min": 3}', "prompt_lookup_min <= prompt_lookup_max"),
        ('{"prompt_lookup_min": 0, "prompt_lookup_max": 2}', "1 <= prompt_lookup_min"),
        ('{"prompt_lookup_min": 4, "prompt_lookup_max": 3}', "got 4 and 3"),
        ('{"prompt_lookup_min": 2, "prompt_lookup_max": "4"}', "integers"),
    ],
)
def test_bad_speculative_config_is_a_value_error_naming_the_problem(text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SpeculativeConfig.from_json(text)


def test_coordinator_config_validates_speculative_config_at_construction():
    with pytest.raises(ValueError, match="overlap"):
        CoordinatorConfig(
            speculative_config='{"num_speculative_tokens_per_batch_size": [[1,2,1],[2,3,1]]}'
        )


def test_cli_defaults_come_from_the_dataclass():
    parser = argparse.ArgumentParser()
    add_flags(parser, CoordinatorConfig)
    default = from_args(CoordinatorConfig, parser.parse_args([]))
    assert default == CoordinatorConfig()
    config = from_args(CoordinatorConfig,
        parser.parse_args(
            [
                "--port", "0",
                "--max-num-seqs", "4",
                "--speculative-config", '{"num_speculative_tokens": 2}',
                "--draft-rebuild-every-step",
                "--draft-timeout", "0.5",
            ]
        )
    )  # fmt: skip
    assert config.port == 0 and config.max_num_seqs == 4 and config.draft_timeout == 0.5
    assert config.draft_rebuild_every_step is True
    assert config.speculative.k_for_batch_size(1) == 2


def test_each_draft_runs_with_the_settings_its_folder_carries_and_flags_override(tmp_path):
    tiny = draft_speculation(
        StackConfig(target_model=str(TINY_TARGET), draft_model=str(TINY_DRAFT))
    )
    assert json.loads(tiny.speculative_config) == {
        "num_speculative_tokens_per_batch_size": [[1, 1, 6], [2, 1024, 0]]
    }
    assert tiny.draft_p_min == 0.0
    real = draft_speculation(StackConfig())  # the default pair's draft carries its own
    assert SpeculativeConfig.from_json(real.speculative_config).prompt_lookup == (3, 4)
    assert real.draft_p_min == 0.4
    flags = StackConfig(
        draft_model=str(TINY_DRAFT),
        speculative_config='{"num_speculative_tokens": 2}',
        draft_p_min=0.2,
    )
    assert draft_speculation(flags) == flags  # flags win
    (tmp_path / "config.json").write_text("{}")  # a draft that carries nothing
    bare = draft_speculation(StackConfig(draft_model=str(tmp_path)))
    assert bare.speculative_config == DEFAULT_SPECULATIVE_CONFIG
    assert bare.draft_p_min == CoordinatorConfig().draft_p_min
