"""bench/load_chat.py (`bench/load.py --multi-turn`): the conversations it sends and the
arithmetic of its report; nothing here starts a process."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from specdec.config import GENERAL_CHAT, REAL_TARGET


def _load_chat():
    """bench/load_chat.py, imported by path: bench/ on sys.path would shadow the packages
    (bench/runtime.py is not the runtime package)."""
    path = Path(__file__).resolve().parents[1] / "bench" / "load_chat.py"
    spec = importlib.util.spec_from_file_location("load_chat", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["load_chat"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


load_chat = _load_chat()


def test_each_user_asks_distinct_general_chat_prompts_and_runs_repeat():
    pool = {p["content"] for p in json.loads(GENERAL_CHAT.read_text())["prompts"]}
    messages = load_chat.user_messages(users=32, turns=4)
    assert len(messages) == 32
    assert all(len(set(m)) == 4 and set(m) <= pool for m in messages)
    assert len({tuple(m) for m in messages}) == 32  # no two conversations alike
    assert messages == load_chat.user_messages(users=32, turns=4)


def test_plain_text_conversation_keeps_the_order_and_ends_where_the_answer_starts():
    history = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "U2"},
    ]
    text = load_chat.as_prompt(history, chat=False)
    assert text == "System: S\n\nUser: U1\n\nAssistant: A1\n\nUser: U2\n\nAssistant:"
    assert load_chat.as_prompt(history, chat=True) == history


def test_cache_report_counts_only_the_run_and_leaves_no_hit_rate_without_lookups():
    def counters(preempted, cached, target, draft):
        services = {"target": target, "draft": draft}
        return {"num_preemptions": preempted, "num_cached_tokens": cached, "services": services}

    before = counters(
        1,
        100,
        {"enabled": True, "queries": 64, "hits": 32},
        {
            "enabled": False,
            "queries": 0,
            "hits": 0,
        },
    )
    after = counters(
        4,
        500,
        {"enabled": True, "queries": 464, "hits": 332},
        {
            "enabled": False,
            "queries": 0,
            "hits": 0,
        },
    )
    report = load_chat.cache_report(before, after)
    assert (report["num_preemptions"], report["num_cached_tokens"]) == (3, 400)
    assert report["prefix_cache"]["target"] == {
        "enabled": True,
        "queries": 400,
        "hits": 300,
        "hit_rate": 0.75,
    }
    assert report["prefix_cache"]["draft"]["hit_rate"] is None


def test_compare_caching_refuses_clearly_without_the_stack_config_field(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class OldStackConfig:
        target_model: str = ""

    monkeypatch.setattr(load_chat, "StackConfig", OldStackConfig)
    monkeypatch.setattr(load_chat, "Stack", None)  # starting one would fail the test
    with pytest.raises(SystemExit, match="enable_prefix_caching"):
        load_chat.compare_caching(OldStackConfig(), load_chat.ChatLoad(), echo=False)


def test_readable_lines_name_every_figure_of_each_mode():
    run = {
        "users": 2,
        "turns": 2,
        "max_tokens": 8,
        "chat_template": False,
        "prefix_caching": True,
        "seconds": 1.0,
        "num_requests": 4,
        "errors_by_code": {"UNAVAILABLE": 1},
        "ttft_ms_p50": 10.0,
        "ttft_ms_p99": 20.0,
        "ttft_ms_p50_by_turn": [12.0, 8.0],
        "output_tok_s": 32.0,
        "last_turn_prompt_tokens_mean": 600,
        "last_turn_prompt_tokens_max": 610,
        "num_preemptions": 2,
        "num_cached_tokens": 64,
        "prefix_cache": {"target": {"enabled": True, "queries": 8, "hits": 4, "hit_rate": 0.5}},
    }
    text = "\n".join(load_chat.readable_lines("multi_turn", run))
    for figure in ("UNAVAILABLE", "p50 10.0", "p99 20.0", "32.0", "preemptions: 2", "50.0%"):
        assert figure in text
    compare = {"caching_on": run, "caching_off": run, "ttft_p50_ratio_on_off": 0.5}
    assert "on/off: 0.5" in "\n".join(load_chat.readable_lines("compare_caching", compare))
    single = {
        "requests_per_level": 20,
        "max_tokens": 64,
        "ttft_p50_ratio": 1.5,
        "ttft_ms_p50_1_clients": 10.0,
        "ttft_ms_p50_4_clients": 15.0,
        "errors_by_code_1_clients": {},
        "errors_by_code_4_clients": {},
    }
    assert "ratio 4/1: 1.5" in "\n".join(load_chat.readable_lines("single_turn_ttft", single))


def test_the_system_prompt_is_about_300_tokens_on_the_real_pair():
    tokenizer_json = REAL_TARGET / "tokenizer.json"
    if not tokenizer_json.exists():
        pytest.skip("the real pair is not fetched (scripts/fetch_models.py)")
    from tokenizers import Tokenizer

    num_tokens = len(Tokenizer.from_file(str(tokenizer_json)).encode(load_chat.SYSTEM_PROMPT))
    assert 270 <= num_tokens <= 330
