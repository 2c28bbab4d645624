"""Coordinator configuration: a frozen dataclass whose fields are the CLI flags."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import MISSING, dataclass, fields
from functools import cached_property


@dataclass(frozen=True)
class SpeculativeConfig:
    """How many tokens the draft proposes per step (vLLM's `--speculative-config` keys).

    `num_speculative_tokens` is a fixed K. `num_speculative_tokens_per_batch_size` is a list
    of inclusive `[min_bs, max_bs, K]` rows (K may be 0); when it is given it decides K, a
    batch size no row covers runs K = 0, and a fixed K given beside it caps every row.
    Neither given: no speculation (K = 0).

    `prompt_lookup_min` / `prompt_lookup_max` (vLLM's ngram keys, both or neither): the
    draft first proposes what followed the last earlier occurrence of the request's last n
    tokens, n from max down to min, and runs its model only where none occurred (greedy
    requests; sampled ones always use the model).
    """

    num_speculative_tokens: int | None = None
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] = ()
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if k is not None and (not _is_int(k) or k < 0):
            raise ValueError(f"num_speculative_tokens must be an integer >= 0, got {k!r}")
        rows = sorted(_parse_row(list(row)) for row in self.num_speculative_tokens_per_batch_size)
        for prev, row in zip(rows, rows[1:], strict=False):
            if row[0] <= prev[1]:
                raise ValueError(
                    f"num_speculative_tokens_per_batch_size rows {list(prev)} and {list(row)} "
                    "overlap: batch-size ranges must be disjoint"
                )
        lookup = (self.prompt_lookup_min, self.prompt_lookup_max)
        if lookup != (None, None) and not (
            all(map(_is_int, lookup)) and 1 <= lookup[0] <= lookup[1]
        ):
            raise ValueError(
                "prompt lookup needs integers 1 <= prompt_lookup_min <= prompt_lookup_max, "
                f"got {lookup[0]!r} and {lookup[1]!r}"
            )
        for row in rows:
            if k is not None and row[2] > k:
                raise ValueError(
                    f"num_speculative_tokens_per_batch_size row {list(row)} asks for more "
                    f"tokens than num_speculative_tokens={k}"
                )

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        """Parses and validates the JSON object; raises ValueError with the reason."""
        text = text.strip()
        if not text:
            return cls()
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"speculative config is not valid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ValueError("speculative config must be a JSON object")
        # "model"/"method" are vLLM keys that name the draft; here the draft is a service.
        unknown = set(obj) - {
            "num_speculative_tokens",
            "num_speculative_tokens_per_batch_size",
            "prompt_lookup_min",
            "prompt_lookup_max",
            "model",
            "method",
        }
        if unknown:
            raise ValueError(f"speculative config has unknown keys: {sorted(unknown)}")
        table = obj.get("num_speculative_tokens_per_batch_size") or []
        if not isinstance(table, list):
            raise ValueError("num_speculative_tokens_per_batch_size must be a list of rows")
        rows = tuple(_parse_row(row) for row in table)
        return cls(
            obj.get("num_speculative_tokens"),
            rows,
            obj.get("prompt_lookup_min"),
            obj.get("prompt_lookup_max"),
        )

    @property
    def prompt_lookup(self) -> tuple[int, int]:
        """(n_min, n_max) for the draft; (0, 0) is off."""
        return (self.prompt_lookup_min or 0, self.prompt_lookup_max or 0)

    @property
    def max_k(self) -> int:
        if self.num_speculative_tokens_per_batch_size:
            return max(row[2] for row in self.num_speculative_tokens_per_batch_size)
        return self.num_speculative_tokens or 0

    def k_for_batch_size(self, batch_size: int) -> int:
        if self.num_speculative_tokens_per_batch_size:
            for lo, hi, k in self.num_speculative_tokens_per_batch_size:
                if lo <= batch_size <= hi:
                    return k
            return 0
        return self.num_speculative_tokens or 0


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_row(row: object) -> tuple[int, int, int]:
    if not isinstance(row, list) or len(row) != 3 or not all(_is_int(x) for x in row):
        raise ValueError(
            f"num_speculative_tokens_per_batch_size row {row!r} must be [min_bs, max_bs, K] "
            "integers"
        )
    lo, hi, k = row
    if lo < 1:
        raise ValueError(f"row {row}: min_bs must be >= 1")
    if lo > hi:
        raise ValueError(f"row {row}: min_bs must be <= max_bs")
    if k < 0:
        raise ValueError(f"row {row}: K must be >= 0")
    return lo, hi, k


@dataclass(frozen=True)
class CoordinatorConfig:
    host: str = "127.0.0.1"
    port: int = 50050
    target: str = "127.0.0.1:50052"  # target service address
    draft: str = "127.0.0.1:50051"  # draft service address; "" = target-only serving
    tokenizer: str = ""  # folder with tokenizer.json (normally the target model); optional
    coordinator_id: str = ""  # who this is to the model services; "" = new at every start
    served_model_name: str = ""  # the model name the gateway's clients send; "" = the target's
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 16
    # Multi-step decoding (vLLM's flag): target forwards per Verify when every scheduled
    # request decodes at K = 0 and none waits; 1 = off.
    num_scheduler_steps: int = 8
    speculative_config: str = '{"num_speculative_tokens": 4}'
    # "auto": while the target verifies a step, the draft proposes for the next one,
    # assuming its proposals are all accepted; "off": draft, then verify, in turn.
    pipeline: str = "auto"
    # Pipelined, at batch 1, greedy: outcomes of the verify the draft prepares proposals
    # for: all accepted, then the first proposal rejected, the second, ... (1 = only all
    # accepted, and only after a verify that accepted everything).
    pipeline_branches: int = 3
    # llama.cpp's --draft-p-min: the draft stops proposing at the first token it gives a
    # probability below this (0 = always K tokens); the rest of K would likely be rejected.
    draft_p_min: float = 0.0
    draft_timeout: float = 2.0  # seconds per draft RPC; a miss runs the step with K = 0
    draft_retry_interval: float = 1.0  # seconds before probing a failed draft again
    draft_max_retry_interval: float = 5.0  # the probe's wait doubles up to this
    target_timeout: float = 300.0  # seconds per Verify
    connect_timeout: float = 120.0  # seconds to wait for both services at startup
    max_queue_len: int = 256  # waiting requests; more is RESOURCE_EXHAUSTED
    kv_scales_file: str = ""  # JSON {"draft": table, "target": table} overriding the services
    draft_rebuild_every_step: bool = False  # control runs: re-ingest the whole log every step
    metrics_port: int = 0  # Prometheus /metrics; 0 = off
    # Required as "authorization: Bearer KEY"; comma-separated keys each open the API, and
    # one key's requests are invisible to another's. Also SPECDEC_API_KEY.
    api_key: str = ""
    # Serve VllmEngine (the gateway's worker API) without the API key: for a gateway in
    # front that checks it, since smg sends no key to its gRPC workers.
    worker_api_without_key: bool = False
    tls_cert: str = ""  # PEM certificate: the public port serves TLS (and mutual TLS, below)
    tls_key: str = ""  # PEM private key of tls_cert
    tls_ca: str = ""  # PEM CA: mutual TLS to the model services (verify them, show tls_cert)

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.num_scheduler_steps < 1:
            raise ValueError("num_scheduler_steps must be >= 1")
        if self.pipeline not in ("off", "auto"):
            raise ValueError(f'pipeline must be "off" or "auto", not {self.pipeline!r}')
        if self.pipeline_branches < 1:
            raise ValueError(f"pipeline_branches must be >= 1, got {self.pipeline_branches}")
        if not 0.0 <= self.draft_p_min < 1.0:
            raise ValueError(f"draft_p_min must be in [0, 1), got {self.draft_p_min}")
        if self.max_queue_len < 0:
            raise ValueError("max_queue_len must be >= 0")
        if self.draft_timeout <= 0 or self.target_timeout <= 0:
            raise ValueError("timeouts must be > 0")
        self.speculative  # validates the JSON at construction  # noqa: B018

    @cached_property
    def speculative(self) -> SpeculativeConfig:
        return SpeculativeConfig.from_json(self.speculative_config)

    @cached_property
    def kv_scales_override(self) -> dict:
        """The kv-scales file's tables by service name ("draft", "target"); {} when unset."""
        if not self.kv_scales_file:
            return {}
        with open(os.path.expanduser(self.kv_scales_file)) as f:
            obj = json.load(f)
        if not isinstance(obj, dict) or not set(obj) <= {"draft", "target"}:
            raise ValueError('kv-scales file must be a JSON object with keys "draft"/"target"')
        return obj

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in fields(cls):
            flag = "--" + f.name.replace("_", "-")
            default = f.default if f.default is not MISSING else None
            if isinstance(default, bool):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
            else:
                parser.add_argument(flag, type=type(default), default=default)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> CoordinatorConfig:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})
