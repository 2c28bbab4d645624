"""The `specdec` command: up, then generate --json against it, then SIGTERM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from e2e_stack import DRAFT, TARGET

SPECDEC = str(Path(sys.executable).parent / "specdec")


def test_specdec_up_serves_generate_json_and_stops_on_sigterm():
    up = subprocess.Popen(
        [SPECDEC, "up", "--port", "0", "--target-model", TARGET,
         "--draft-model", DRAFT],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        line = ""
        while "coordinator listening on" not in line:
            line = up.stdout.readline()
            assert line, "specdec up exited before serving"
        address = line.split()[-1]
        done = subprocess.run(
            [SPECDEC, "generate", "--address", address,
             "--prompt", "def add(a, b):", "--max-tokens", "12", "--json"],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        out = json.loads(done.stdout)
        assert set(out) >= {"token_ids", "text", "finish_reason", "num_prompt_tokens", "stats"}
        assert 1 <= len(out["token_ids"]) <= 12 and out["num_prompt_tokens"] > 0
        assert set(out["stats"]) >= {
            "num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position"
        }  # fmt: skip
        # The bundled tiny target has no chat template: a chat turn is refused, clearly.
        refused = subprocess.run(
            [SPECDEC, "generate", "--address", address, "--chat", "hi", "--json"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert refused.returncode == 1
        assert "INVALID_ARGUMENT" in refused.stderr and "chat template" in refused.stderr
    finally:
        up.terminate()
        assert up.wait(30) == 0
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.FutureTimeoutError):
        grpc.channel_ready_future(channel).result(timeout=2)
