"""`specdec`: up | generate | demo | bench."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

import grpc

from specdec.client import CoordinatorClient, GenerateParams
from specdec.config import StackConfig
from specdec.flags import HelpFormatter, add_flags, from_args
from specdec.launcher import Stack
from specdec.supervisor import Supervisor


def add_stack_args(parser: argparse.ArgumentParser) -> None:
    """Flags from StackConfig's fields (vLLM's names: --kv-cache-dtype, --max-num-seqs, ...)."""
    add_flags(parser, StackConfig)
    parser.add_argument("--verbose", action="store_true", help="echo the services' logs")


def stack_config(args: argparse.Namespace) -> StackConfig:
    return from_args(StackConfig, args)


def cmd_up(args: argparse.Namespace) -> int:
    stack = Stack(stack_config(args), echo=args.verbose)
    stop = {"now": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stack.start()
    for i, (address, target) in enumerate(
        zip(stack.addresses, stack.target_addresses, strict=True)
    ):
        name = "coordinator" if len(stack.addresses) == 1 else f"coordinator {i}"
        print(f"{name} listening on {address}", flush=True)
        print(f"  target {target}, draft {stack.draft_address or 'none'}", flush=True)
    if stack.gateway_url:
        print(f"openai gateway listening on {stack.gateway_url}", flush=True)
    supervisor = Supervisor(stack)
    try:
        while not stop["now"]:
            time.sleep(0.2)
            for line in supervisor.poll():
                print(f"specdec up: {line}", file=sys.stderr, flush=True)
    finally:
        stack.stop()
    return 0


def parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        msg = f"--prompt-ids must be comma-separated ints: {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def parse_messages(text: str) -> list[dict[str, str]]:
    try:
        messages = json.loads(text)
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m
            for m in messages
        ):
            raise ValueError
    except ValueError:
        msg = f'--messages must be a JSON list of {{"role": ..., "content": ...}}: {text!r}'
        raise argparse.ArgumentTypeError(msg) from None
    return [{"role": m["role"], "content": str(m["content"])} for m in messages]


def cmd_generate(args: argparse.Namespace) -> int:
    params = GenerateParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        num_speculative_tokens=args.num_speculative_tokens,
        ignore_eos=args.ignore_eos,
    )
    if args.chat is not None:
        prompt = [{"role": "user", "content": args.chat}]
    else:
        prompt = next(p for p in (args.prompt, args.prompt_ids, args.messages) if p is not None)

    def show(text: str) -> None:
        print(text, end="", flush=True)

    with CoordinatorClient(args.address, args.api_key, args.tls_ca) as client:
        try:
            out = client.generate(prompt, params, on_text=None if args.json else show)
        except grpc.RpcError as e:
            print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(out.as_json()))
    else:
        s = out.stats
        rate = s["num_accepted_tokens"] / s["num_draft_tokens"] if s["num_draft_tokens"] else 0
        print(
            f"\n[{len(out.token_ids)} tokens in {out.seconds:.2f}s, finish={out.finish_reason}, "
            f"acceptance {rate:.2f}]",
            file=sys.stderr,
        )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from specdec.demo import run_demo

    return run_demo(stack_config(args), args.num_prompts, args.max_tokens, args.verbose)


def cmd_bench(args: argparse.Namespace) -> int:
    from specdec.bench import run_bench

    return run_bench(stack_config(args), args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser(
        "up", formatter_class=HelpFormatter, help="start target, draft and coordinator on loopback"
    )
    add_stack_args(up)
    up.set_defaults(func=cmd_up)

    gen = sub.add_parser(
        "generate",
        formatter_class=HelpFormatter,
        help="stream one completion from a running coordinator",
    )
    gen.add_argument("--address", default="127.0.0.1:50050")
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt")
    prompt.add_argument("--prompt-ids", type=parse_ids)
    prompt.add_argument(
        "--messages", type=parse_messages, help='chat: \'[{"role": "user", "content": "..."}]\''
    )
    prompt.add_argument("--chat", help="one user turn, sent as chat messages")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--num-speculative-tokens", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--json", action="store_true", help="print one JSON object at the end")
    gen.add_argument("--api-key", help="the coordinator's API key (default: $SPECDEC_API_KEY)")
    gen.add_argument("--tls-ca", default="", help="PEM CA: the coordinator serves TLS")
    gen.set_defaults(func=cmd_generate)

    demo = sub.add_parser(
        "demo", formatter_class=HelpFormatter, help="the main job on the bundled models"
    )
    add_stack_args(demo)
    demo.add_argument("--num-prompts", type=int, default=3)
    demo.add_argument("--max-tokens", type=int, default=96)
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser(
        "bench",
        formatter_class=HelpFormatter,
        help="measure spec decoding against target-only and HF",
    )
    add_stack_args(bench)
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--new-tokens", type=int, default=128)
    bench.add_argument("--batch-sizes", default="1,4,16")
    bench.add_argument("--no-hf", action="store_true", help="skip the transformers baselines")
    bench.add_argument(
        "--prompts",
        metavar="FILE.json",
        help='chat prompts ({"prompts": [{"content": ..., "category": ...}]}, e.g. '
        "bench/prompts/general_chat.json), categories taking turns; default: the pair's "
        "held-out prompts",
    )
    bench.add_argument(
        "--num-prompts", type=int, default=4, help="prompts run one at a time at batch 1 (4)"
    )
    bench.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw tok/s by batch size and acceptance (matplotlib)",
    )
    bench.add_argument(
        "--gateway", action="store_true", help="also compare direct gRPC with the OpenAI gateway"
    )
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        sys.exit(args.func(args))
    except RuntimeError as e:  # a service failed to start, with its last output
        print(f"specdec {args.command}: {e}", file=sys.stderr)
        sys.exit(1)
