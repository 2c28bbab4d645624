"""One default per knob: every `specdec up` flag that a service or the coordinator also
takes has that one's default, or the stack's own with its reason stated in one place; and
the command lines the launcher writes parse back to the configs it built."""

from __future__ import annotations

import argparse
import os
from dataclasses import fields

import pytest

from specdec.config import StackConfig
from specdec.coordinator.engine.config import CoordinatorConfig
from specdec.flags import add_flags, from_args, to_argv
from specdec.launcher import Stack
from specdec.model_service.config import ServiceConfig

PASSED = [f for f in fields(StackConfig) if "passed_to" in f.metadata]


@pytest.mark.parametrize("f", PASSED, ids=lambda f: f.name)
def test_a_passed_knob_has_its_owners_default_or_a_stated_reason(f):
    owner, name = f.metadata["passed_to"]
    (source,) = [g for g in fields(owner) if g.name == name]
    if f.default != source.default:
        assert len(f.metadata.get("why", "")) > 20, f"{f.name}: its own default, no reason"
        assert f.metadata["why"] in f.metadata["help"]  # --help says it


def test_every_flag_the_coordinator_shares_with_the_stack_is_passed_not_copied():
    coordinator = {f.name for f in fields(CoordinatorConfig)}
    own = {"target_model", "draft_model", "draft_dtype", "no_draft", "with_baseline", "replicas"}
    own |= {f.name for f in fields(StackConfig) if f.name.startswith("gateway_")}
    for f in fields(StackConfig):
        if f.name in coordinator and f.name not in own:
            assert f.metadata.get("passed_to", (None,))[0] is CoordinatorConfig, f.name


def parse(cls, argv, prog="x"):
    parser = add_flags(argparse.ArgumentParser(prog=prog), cls)
    return from_args(cls, parser.parse_args(argv))


def test_the_launchers_command_lines_parse_back_to_its_configs():
    stack = Stack(StackConfig(max_num_seqs=4, pipeline="off", tls_ca="ca.pem", replicas=2))
    for service in ("target", "draft"):
        config = stack.config.service_config(service, "models/target", 0)
        argv = stack.model_argv(service, "models/target", 0)
        assert argv[1:3] == ["-m", f"specdec.{service}_service"]
        assert parse(ServiceConfig, argv[3:]) == config
    coordinator = stack.config.coordinator_config(port=0, target="t:1", draft="d:2")
    assert parse(CoordinatorConfig, to_argv(coordinator)) == coordinator
    assert coordinator.max_num_seqs == 4 and coordinator.pipeline == "off"


@pytest.mark.parametrize("cls", [StackConfig, CoordinatorConfig, ServiceConfig])
def test_help_shows_every_flag_with_its_text(cls):
    parser = add_flags(argparse.ArgumentParser(prog="x"), cls)
    for action in parser._actions[1:]:
        assert action.help, f"{action.option_strings} has no help"


@pytest.mark.parametrize(
    ("flags", "threads", "beside_draft"),
    [
        ({}, 0, max((os.cpu_count() or 1) - 1, 1)),  # every core; the draft's one apart
        ({"draft_num_threads": 3}, 0, max((os.cpu_count() or 1) - 3, 1)),
        ({"no_draft": True}, 0, 0),  # target-only: every core, always
        ({"no_draft": True, "target_num_threads": 1}, 1, 0),  # the flag wins
        ({"target_num_threads": 2}, 2, 0),
    ],
)
def test_the_target_service_leaves_the_draft_its_cores_only_while_it_computes(
    flags, threads, beside_draft
):
    stack = StackConfig(**flags)
    assert stack.service_config("target", "models/target", 0).num_threads == threads
    coordinator = stack.coordinator_config(draft_p_min=0.0)  # as the launcher resolves it
    assert coordinator.target_threads_beside_draft == beside_draft
    draft_threads = flags.get("draft_num_threads", 1)
    assert stack.service_config("draft", "models/draft", 0).num_threads == draft_threads
