"""How `specdec up` starts the gateway: smg's own CLI parses the command, and what the
gateway cannot do is refused before anything starts."""

from __future__ import annotations

import argparse

import pytest
from smg.router_args import RouterArgs

from specdec.config import StackConfig
from specdec.gateway import check_gateway_config, gateway_argv


def test_gateway_command_parses_with_smg_and_names_every_coordinator():
    workers = ["127.0.0.1:5001", "127.0.0.1:5002"]
    argv = gateway_argv(workers, "127.0.0.1", 8000, "least_load", 8001, "adm", "key")
    assert argv[1:4] == ["-m", "smg", "launch"]
    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser)
    args = RouterArgs.from_cli_args(parser.parse_args(argv[4:]))
    assert args.worker_urls == ["grpc://127.0.0.1:5001", "grpc://127.0.0.1:5002"]
    assert (args.backend, args.policy, args.port) == ("vllm", "least_load", 8000)
    assert (args.prometheus_host, args.prometheus_port) == ("127.0.0.1", 8001)
    assert args.control_plane_api_keys == [("specdec", "specdec up", "adm", "admin")]
    assert args.api_key == "key"


def test_the_gateway_takes_one_api_key():
    check_gateway_config(StackConfig(gateway_port=8000, api_key="k"))
    with pytest.raises(RuntimeError, match="one --api-key"):
        check_gateway_config(StackConfig(gateway_port=8000, api_key="k1,k2"))
