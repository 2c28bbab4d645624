"""The real SGLang Model Gateway (``smg``) in front of the stack: the OpenAI API with the
stock ``openai`` client, bad requests as 4xx, disconnects as aborts, and two replicas
sharing one draft."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import jsonschema
import openai
import pytest
from e2e_stack import running_stack, wait_until

from specdec.client import CoordinatorClient, GenerateParams
from specdec.config import REAL_DRAFT, REAL_TARGET
from specdec.gateway import free_port, registered_workers
from specdec.launcher import held_out_prompts
from specdec.supervisor import Supervisor
from specdec.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc

pytestmark = pytest.mark.slow
MAX_TOKENS = 12
KEY = "gateway-test-key"


def num_sequences(stub_cls, address: str, stack) -> int:
    with grpc.insecure_channel(address) as channel:
        info = stub_cls(channel).GetInfo(
            common_pb2.InfoRequest(), timeout=10, metadata=stack.internal_metadata
        )
    return info.num_sequences


def healthy_workers(stack) -> int:
    workers = registered_workers(stack.gateway_url, stack.gateway_admin_key)
    return sum(1 for w in workers if w["is_healthy"])


def control_plane(stack, method: str, path: str, key: str | None) -> int:
    """The HTTP status of a call to the gateway (its control plane, or the API without a key)."""
    request = urllib.request.Request(
        stack.gateway_url.removesuffix("/v1") + path,
        method=method,
        data=json.dumps({"url": "grpc://127.0.0.1:1", "runtime": "vllm"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture(scope="module")
def real_stack():
    if not (Path(REAL_TARGET, "config.json").is_file() and Path(REAL_DRAFT).is_dir()):
        pytest.skip("the real pair is not here: run scripts/fetch_models.py")
    with running_stack(
        target_model=str(REAL_TARGET),
        draft_model=str(REAL_DRAFT),
        gateway_port=free_port(),
        served_model_name="smollm2",
        api_key=KEY,
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(real_stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_stack.gateway_url, api_key=KEY, max_retries=0)


def test_the_openai_api_and_the_control_plane_need_their_keys(real_stack, client):
    stranger = openai.OpenAI(base_url=real_stack.gateway_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.completions.create(model="smollm2", prompt="Hello", max_tokens=2)
    assert control_plane(real_stack, "POST", "/v1/completions", None) == 401  # no key at all
    worker_id = registered_workers(real_stack.gateway_url, real_stack.gateway_admin_key)[0]["id"]
    for key in (None, "wrong-key", KEY):  # the API key is not the admin key
        assert control_plane(real_stack, "POST", "/workers", key) == 401
        assert control_plane(real_stack, "DELETE", f"/workers/{worker_id}", key) == 401
        assert control_plane(real_stack, "GET", "/workers", key) == 401
    with (
        CoordinatorClient(real_stack.address, api_key="") as direct,
        pytest.raises(grpc.RpcError) as err,
    ):
        direct.generate("Hello", GenerateParams(max_tokens=2))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert healthy_workers(real_stack) == 1
    assert client.completions.create(model="smollm2", prompt="Hi", max_tokens=2).usage


def test_a_worker_removed_from_the_gateway_is_registered_again_by_the_supervisor(
    real_stack, client
):
    url, admin = real_stack.gateway_url, real_stack.gateway_admin_key
    worker_id = registered_workers(url, admin)[0]["id"]
    assert control_plane(real_stack, "DELETE", f"/workers/{worker_id}", admin) == 202
    assert wait_until(lambda: not registered_workers(url, admin), timeout=30)
    with pytest.raises(openai.APIStatusError):
        client.completions.create(model="smollm2", prompt="Hi", max_tokens=2)
    supervisor = Supervisor(real_stack)
    lines: list[str] = []
    assert wait_until(lambda: lines.extend(supervisor.poll()) or healthy_workers(real_stack) == 1)
    assert any("lost coordinator" in line for line in lines)
    assert client.completions.create(model="smollm2", prompt="Hi", max_tokens=2).usage


def test_completions_equal_direct_generate(real_stack, client):
    prompt = "The three primary colours are"
    params = GenerateParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    with CoordinatorClient(real_stack.address, api_key=KEY) as direct:
        expected = direct.generate(prompt, params).text
    reply = client.completions.create(
        model="smollm2", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
    )
    assert reply.choices[0].text == expected
    assert reply.usage.completion_tokens == MAX_TOKENS
    # Acceptance reaches the client as the usage's prediction-token counts.
    details = reply.usage.completion_tokens_details
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0
    stream = client.completions.create(
        model="smollm2", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == expected


def test_chat_completions_use_the_chat_template(real_stack, client):
    chat = held_out_prompts(str(REAL_TARGET), 1)[0]
    with CoordinatorClient(real_stack.address, api_key=KEY) as direct:
        expected = direct.generate(chat, GenerateParams(max_tokens=MAX_TOKENS)).text
    reply = client.chat.completions.create(
        model="smollm2", messages=chat, max_tokens=MAX_TOKENS, temperature=0
    )
    assert reply.choices[0].message.content == expected
    stream = client.chat.completions.create(
        model="smollm2", messages=chat, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected


def test_stop_string_ends_the_request_in_the_worker(real_stack, client):
    prompt = "Count: one, two, three, four, five,"
    full = client.completions.create(
        model="smollm2", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
    )
    text = full.choices[0].text
    stop = text.strip().split()[1]  # the second word of the greedy continuation
    reply = client.completions.create(
        model="smollm2", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stop=[stop]
    )
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].text == text[: text.index(stop)]
    assert reply.usage.completion_tokens < MAX_TOKENS  # the worker stopped, not just the text


def test_disconnect_mid_stream_aborts_and_frees_kv(real_stack, client):
    stream = client.completions.create(
        model="smollm2", prompt="Write a long story.", max_tokens=400, temperature=0,
        stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    next(iter(stream))
    assert num_sequences(target_pb2_grpc.TargetServiceStub, real_stack.target_address, real_stack)
    stream.close()
    for stub_cls, address in (
        (target_pb2_grpc.TargetServiceStub, real_stack.target_address),
        (draft_pb2_grpc.DraftServiceStub, real_stack.draft_address),
    ):
        assert wait_until(lambda s=stub_cls, a=address: num_sequences(s, a, real_stack) == 0)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"model": "no-such-model"}, "model"),
        ({"prompt": "word " * 20000}, "context length"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"extra_body": {"min_p": 1.5}}, "min_p"),
        ({"extra_body": {"repetition_penalty": -1.0}}, "repetition_penalty"),
    ],
)
def test_bad_requests_are_4xx_with_a_message(real_stack, client, kwargs, words):
    args = {"model": "smollm2", "prompt": "Hello", "max_tokens": 4, **kwargs}
    with pytest.raises(openai.APIStatusError) as error:
        client.completions.create(**args)
    assert 400 <= error.value.status_code < 500
    assert words in str(error.value)
    ok = client.completions.create(model="smollm2", prompt="Hello", max_tokens=2)
    assert ok.usage.completion_tokens == 2


@pytest.mark.parametrize("seed", [-1, -5, -(2**31)])
def test_a_negative_seed_is_a_400_naming_seed_and_its_neighbours_finish_unchanged(
    real_stack, client, seed
):
    prompts = [f"Tell me about {topic}." for topic in ("rivers", "bread", "owls", "glass")]
    greedy = {"model": "smollm2", "max_tokens": 24, "temperature": 0}
    alone = [client.completions.create(prompt=p, **greedy).choices[0].text for p in prompts]
    texts: list[str] = [""] * len(prompts)

    def stream(i: int) -> None:
        for chunk in client.completions.create(prompt=prompts[i], stream=True, **greedy):
            texts[i] += chunk.choices[0].text if chunk.choices else ""

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model="smollm2", prompt="Hello", max_tokens=8, seed=seed)
    for t in threads:
        t.join(60)
    assert "seed" in str(error.value)
    assert texts == alone


def test_huge_prompts_do_not_stall_a_running_stream(real_stack):
    # Ten 1.4 MB prompts, refused by their size alone, and four just small enough to be
    # tokenised (then refused for max_model_len): none may hold the coordinator's loop.
    # (The real target: 8,192 tokens of at most 81 characters each, so 663,552 characters.)
    huge = ["word " * 280_000] * 10 + ["hello world " * 50_000] * 4
    gaps: list[float] = []

    def stream() -> None:
        with CoordinatorClient(real_stack.address, api_key=KEY) as c:
            last = None
            params = GenerateParams(max_tokens=200, ignore_eos=True)
            for _ in c.stream("Write a long story about a lighthouse.", params, timeout=120):
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now

    def refused(prompt: str) -> grpc.StatusCode:
        with CoordinatorClient(real_stack.address, api_key=KEY) as c:
            try:
                c.generate(prompt, GenerateParams(max_tokens=4), timeout=60)
            except grpc.RpcError as e:
                return e.code()
        return grpc.StatusCode.OK

    streaming = threading.Thread(target=stream)
    streaming.start()
    time.sleep(0.5)
    codes = []
    workers = [threading.Thread(target=lambda p=p: codes.append(refused(p))) for p in huge]
    for t in workers:
        t.start()
    for t in workers:
        t.join(120)
    streaming.join(120)
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * len(huge)
    # A stall, not a speed bar: 0.13 s measured here; tokenising on the loop gave 2.4 s.
    assert len(gaps) > 20 and max(gaps) < 0.5, f"largest inter-token gap {max(gaps):.3f} s"


def test_two_replicas_share_one_draft(prompt_ids, tokenizer):
    # K = 3 at every batch size: the default schedule drafts at batch 1 and 2 only, and eight
    # requests over two replicas run in batches.
    spec = '{"num_speculative_tokens": 3}'
    with running_stack(replicas=2, gateway_port=free_port(), speculative_config=spec) as stack:
        client = openai.OpenAI(base_url=stack.gateway_url, api_key="unused", max_retries=0)
        prompts = [tokenizer.decode(ids) for ids in prompt_ids[:8]]
        params = GenerateParams(max_tokens=24, ignore_eos=True, num_speculative_tokens=0)
        with CoordinatorClient(stack.address) as direct:
            # K = 0 is target-only decoding on the same target weights.
            expected = [direct.generate(p, params).text for p in prompts]
        outputs: list[str | None] = [None] * len(prompts)

        def ask(i: int) -> None:
            reply = client.completions.create(
                model="target", prompt=prompts[i], max_tokens=24, temperature=0,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            outputs[i] = reply.choices[0].text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outputs == expected
        steps = []
        for address in stack.addresses:
            with CoordinatorClient(address) as c:
                steps.append(c.totals().num_drafts)
        assert all(n > 0 for n in steps), f"drafted steps per replica: {steps}"

        # A request in flight on replica 1 when its coordinator dies: the draft keeps its
        # sequence until that coordinator comes back under the same name.
        victim = next(p for p in stack.processes if p.name == "coordinator-1")
        with CoordinatorClient(stack.addresses[1]) as c:
            long = c.stream(prompts[0], GenerateParams(max_tokens=1000, ignore_eos=True))
            next(long)
            os.kill(victim.proc.pid, signal.SIGKILL)
            victim.proc.wait()
        draft = (draft_pb2_grpc.DraftServiceStub, stack.draft_address, stack)
        assert num_sequences(*draft) == 1
        # The gateway's health checks take the dead replica out; the other one serves.
        assert wait_until(lambda: healthy_workers(stack) == 1, timeout=60)
        for i in range(3):
            ask(i)
            assert outputs[i] == expected[i]
        revived = victim.respawned()
        stack.processes[stack.processes.index(victim)] = revived
        revived.wait_ready(120)
        assert wait_until(lambda: num_sequences(*draft) == 0)
        # The gateway routes to it again once its health check passes.
        assert wait_until(lambda: healthy_workers(stack) == 2, timeout=60)
        with CoordinatorClient(stack.addresses[1]) as c:
            assert c.generate(prompts[1], params).text == expected[1]


def test_the_request_surface_through_the_stock_client(client):
    """logprobs, n, penalties and structured output reach the worker and come back."""
    messages = [{"role": "user", "content": "Name three colors."}]

    def chat(**kwargs):
        kwargs = {"max_tokens": 24, "temperature": 0, **kwargs}
        return client.chat.completions.create(model="smollm2", messages=messages, **kwargs)

    plain = chat(logprobs=True, top_logprobs=3)
    steps = plain.choices[0].logprobs.content
    # One per token of the text: the gateway shows none for the EOS that ended it.
    assert len(steps) == plain.usage.completion_tokens - 1
    assert all(s.top_logprobs[0].token == s.token and len(s.top_logprobs) == 3 for s in steps)
    assert all(s.logprob <= 0 for s in steps)
    samples = chat(n=4, temperature=1.0, seed=4)
    assert sorted(c.index for c in samples.choices) == [0, 1, 2, 3]
    assert [c.message.content for c in samples.choices] == [
        c.message.content for c in chat(n=4, temperature=1.0, seed=4).choices
    ]
    assert len({c.message.content for c in samples.choices}) > 1
    penalised = chat(presence_penalty=2.0, frequency_penalty=2.0, max_tokens=40)
    assert penalised.choices[0].message.content != plain.choices[0].message.content
    schema = {
        "type": "object",
        "properties": {"colors": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["colors"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "colors", "schema": schema}}
    answer = chat(response_format=fmt, max_tokens=60).choices[0].message.content
    jsonschema.validate(json.loads(answer), schema)
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}
    with pytest.raises(openai.BadRequestError, match="Invalid type: foo"):
        chat(response_format=bad)
    assert chat(max_tokens=4).usage.completion_tokens == 4
