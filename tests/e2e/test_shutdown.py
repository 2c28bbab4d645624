"""A stopping coordinator leaves nothing held on either model service, even when SIGTERM
comes right after its last response, while the releases of that request are in flight."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e_stack import running_stack, service_info

from specdec.client import CoordinatorClient, GenerateParams

NUM_COORDINATORS = 50
PARALLEL = 5


@pytest.fixture(scope="module")
def stack():
    with running_stack(speculative_config='{"num_speculative_tokens": 3}') as s:
        yield s


def serve_one_then_stop(stack, index: int, prompt: list[int]) -> int:
    """Starts a coordinator, streams one request, SIGTERMs it on the last response; returns
    its exit status."""
    process = stack.spawn_coordinator(
        f"stopped-{index}", 0, stack.target_address, stack.draft_address, 0
    )
    address = process.wait_ready(120)
    params = GenerateParams(max_tokens=6, ignore_eos=True)
    with CoordinatorClient(address) as client:
        for response in client.stream(prompt, params, timeout=60):
            if response.finish_reason:
                process.proc.send_signal(signal.SIGTERM)
    return process.proc.wait(60)


def test_coordinators_stopped_right_after_their_last_response_leave_nothing_held(stack, prompt_ids):
    with ThreadPoolExecutor(PARALLEL) as pool:
        codes = list(
            pool.map(
                lambda i: serve_one_then_stop(stack, i, prompt_ids[i % len(prompt_ids)]),
                range(NUM_COORDINATORS),
            )
        )
    assert codes == [0] * NUM_COORDINATORS
    assert service_info(stack, draft=False).num_sequences == 0
    assert service_info(stack, draft=True).num_sequences == 0
