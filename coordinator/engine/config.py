"""Coordinator configuration: frozen dataclasses whose fields are the flags (specdec.flags)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property

from specdec.coordinator.engine.speculation_gate import MAX_PROBE_INTERVAL, PROBE_INTERVAL


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


def _help(text: str) -> dict:
    return {"help": text}


# One row per batch-size range (vLLM's format): K = 6 for a request alone, 4 for two, none
# from three on, and prompt lookup first (vLLM's ngram keys). A draft may carry its own
# (its folder's ``speculators_config``), which `specdec up` passes instead.
DEFAULT_SPECULATIVE_CONFIG = (
    '{"num_speculative_tokens_per_batch_size": [[1, 1, 6], [2, 2, 4], [3, 1024, 0]], '
    '"prompt_lookup_min": 3, "prompt_lookup_max": 4}'
)


@dataclass(frozen=True)
class CoordinatorConfig:
    """The coordinator's flags (``python -m specdec.coordinator``); vLLM's names where vLLM
    has one. `specdec up` passes the stack's values through ``specdec.flags.to_argv``."""

    host: str = field(default="127.0.0.1", metadata=_help("address to bind"))
    port: int = field(default=50050, metadata=_help("port to bind (0 = any free port)"))
    target: str = field(default="127.0.0.1:50052", metadata=_help("target service address"))
    draft: str = field(
        default="127.0.0.1:50051", metadata=_help('draft service address; "" = target-only')
    )
    tokenizer: str = field(
        default="", metadata=_help("folder with tokenizer.json (normally the target's)")
    )
    coordinator_id: str = field(
        default="",
        metadata=_help("who this is to the model services; empty = new at every start"),
    )
    served_model_name: str = field(
        default="", metadata=_help("the model name the gateway's clients send; empty = target's")
    )
    max_num_batched_tokens: int = field(
        default=512, metadata=_help("tokens per step, prefill chunks included")
    )
    max_num_seqs: int = field(default=16, metadata=_help("requests running at once"))
    num_scheduler_steps: int = field(
        default=8,
        metadata=_help(
            "target forwards per Verify when every scheduled request decodes at K = 0 and "
            "none waits (multi-step decoding); 1 = off"
        ),
    )
    speculative_config: str = field(
        default=DEFAULT_SPECULATIVE_CONFIG,
        metadata=_help(
            "vLLM's JSON: num_speculative_tokens, num_speculative_tokens_per_batch_size, "
            "prompt_lookup_min/max"
        ),
    )
    pipeline: str = field(
        default="auto",
        metadata={
            "choices": ("auto", "off"),
            "help": "auto: while the target verifies a step, the draft proposes for the next",
        },
    )
    pipeline_branches: int = field(
        default=3,
        metadata=_help(
            "pipelined at batch 1, greedy: verify outcomes the draft prepares proposals for "
            "(all accepted, first proposal rejected, ...); 1 = all accepted only, as where "
            "--target-threads-beside-draft is set"
        ),
    )
    speculative_gate: str = field(
        default="goodput",
        metadata={
            "choices": ("goodput", "off"),
            "help": "goodput: a request proposes only while its measured speculative rate "
            f"beats plain decoding at the batch size, probing again after {PROBE_INTERVAL} "
            f"plain tokens (doubling to {MAX_PROBE_INTERVAL} while probes lose); off: every "
            "step at the configured K",
        },
    )
    target_threads_beside_draft: int = field(
        default=0,
        metadata=_help(
            "a draft sharing the target's cores: the target's threads for a step in which the "
            "draft computes (all of them in steps where it does not); 0 = always all"
        ),
    )
    draft_p_min: float = field(
        default=0.0,
        metadata=_help(
            "llama.cpp's: the draft stops proposing at a token after its first that it gives "
            "less than this probability (0 = always K)"
        ),
    )
    draft_timeout: float = field(
        default=2.0, metadata=_help("seconds per draft RPC; a miss runs the step with K = 0")
    )
    draft_retry_interval: float = field(
        default=1.0, metadata=_help("seconds before probing a failed draft again")
    )
    draft_max_retry_interval: float = field(
        default=5.0, metadata=_help("the draft probe's wait doubles up to this")
    )
    target_timeout: float = field(default=300.0, metadata=_help("seconds per Verify"))
    target_probe_interval: float = field(
        default=1.0,
        metadata=_help("seconds between health probes of the target, and their deadline"),
    )
    connect_timeout: float = field(
        default=120.0, metadata=_help("seconds to wait for both services at start")
    )
    max_queue_len: int = field(
        default=256, metadata=_help("waiting requests; more are refused RESOURCE_EXHAUSTED")
    )
    kv_scales_file: str = field(
        default="",
        metadata=_help('JSON {"draft": table, "target": table} overriding the services\' scales'),
    )
    draft_rebuild_every_step: bool = field(
        default=False, metadata=_help("control runs: re-ingest the whole log every step")
    )
    metrics_port: int = field(default=0, metadata=_help("Prometheus /metrics; 0 = off"))
    api_key: str = field(
        default="",
        metadata=_help(
            'required as "authorization: Bearer KEY"; comma-separated keys each open the API '
            "and see only their own requests (also SPECDEC_API_KEY)"
        ),
    )
    worker_api_without_key: bool = field(
        default=False,
        metadata=_help(
            "serve VllmEngine (the gateway's worker API) without the API key, for a gateway "
            "in front that checks it"
        ),
    )
    tls_cert: str = field(default="", metadata=_help("PEM certificate: the public port serves TLS"))
    tls_key: str = field(default="", metadata=_help("PEM private key of --tls-cert"))
    tls_ca: str = field(default="", metadata=_help("PEM CA: mutual TLS to the model services"))

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.num_scheduler_steps < 1:
            raise ValueError("num_scheduler_steps must be >= 1")
        if self.pipeline not in ("off", "auto"):
            raise ValueError(f'pipeline must be "off" or "auto", not {self.pipeline!r}')
        if self.speculative_gate not in ("goodput", "off"):
            raise ValueError(
                f'speculative_gate must be "goodput" or "off", not {self.speculative_gate!r}'
            )
        if self.target_threads_beside_draft < 0:
            raise ValueError(
                f"target_threads_beside_draft must be >= 0, got {self.target_threads_beside_draft}"
            )
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
