"""`specdec up`'s configuration: the stack's own settings, and the knobs it passes to the
coordinator and the model services, each with the default and help of the field it passes
to (one default per knob), from which the launcher writes their command lines."""

from __future__ import annotations

import json
import os
from dataclasses import Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from specdec.coordinator.engine.config import CoordinatorConfig
from specdec.flags import to_argv
from specdec.model_service.config import ServiceConfig, parse_size

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
# Hand-written chat prompts, ten per category, for evaluation only (never trained on).
GENERAL_CHAT = MODELS_DIR.parent / "bench" / "prompts" / "general_chat.json"
# The real pair, the default: SmolLM2-135M-Instruct as its Q4_1 GGUF (a folder holding the
# file, its tokenizer and KV scales, fetched by scripts/fetch_models.py) and the draft
# trained for it (completed by the same script); and the bundled tiny pair, which the tests
# and the llama.cpp comparison select explicitly.
REAL_TARGET = MODELS_DIR / "smollm2-135m-instruct-q4_1"
REAL_DRAFT = MODELS_DIR / "smollm2-draft"
TINY_TARGET = MODELS_DIR / "target"
TINY_DRAFT = MODELS_DIR / "draft"
# The key of a draft's config.json that holds the settings tuned for it (vLLM's
# speculators checkpoints keep theirs under the same name): {"speculative_config": {...},
# "draft_p_min": P}.
SPECULATORS_CONFIG = "speculators_config"
# The default KV pools hold max_num_seqs sequences (at least MIN_DEFAULT_SEQUENCES, so
# one request of a long context fits too) of this many tokens (a chat with its history).
TYPICAL_SEQUENCE_TOKENS = 2048
MIN_DEFAULT_SEQUENCES = 16
_SERVICE_DEFAULTS = {f.name: f.default for f in fields(ServiceConfig)}


def passed_to(cls: type, name: str, stack_default: Any = None, why: str = "") -> Any:
    """A stack field that is ``cls``'s field ``name`` passed through: its default and help,
    or, with ``why``, the stack's own ``stack_default`` for it (the one place a knob's
    default differs from the service's or the coordinator's, with the reason). The stack's
    field name is its flag."""
    source: Field = next(f for f in fields(cls) if f.name == name)
    metadata = {k: v for k, v in source.metadata.items() if k != "flags"}
    metadata["passed_to"] = (cls, name)
    if not why:
        return field(default=source.default, metadata=metadata)
    metadata.pop("type", None)
    if stack_default not in metadata.get("choices", (stack_default,)):
        metadata.pop("choices")
    help_text = f"{metadata.get('help') or ''} [specdec up: {why}]".strip()
    return field(default=stack_default, metadata={**metadata, "help": help_text, "why": why})


def _help(text: str) -> dict:
    return {"help": text}


@dataclass(frozen=True)
class StackConfig:
    """The flags of `specdec up`, `demo` and `bench` (vLLM's names where vLLM has one)."""

    target_model: str = field(
        default=str(REAL_TARGET),
        metadata=_help("a Hugging Face folder, a .gguf file, or a folder holding one"),
    )
    draft_model: str = field(default=str(REAL_DRAFT), metadata=_help("the same, for the draft"))
    tokenizer: str = passed_to(
        CoordinatorConfig, "tokenizer", "", "empty = the target's folder (a .gguf's folder)"
    )
    kv_cache_dtype: str = passed_to(ServiceConfig, "kv_cache_dtype")
    dtype: str = passed_to(ServiceConfig, "dtype")
    draft_dtype: str = field(
        default="auto",
        metadata=_help(
            "the draft's weights: auto keeps a 16-bit checkpoint in its own dtype (a draft's "
            "precision never changes the output), else --dtype"
        ),
    )
    draft_quantization: str = passed_to(
        ServiceConfig,
        "quantization",
        "int8",
        "the draft's linears as int8: a quarter of float32's bytes per draft token, and a "
        "draft's precision never changes the output",
    )
    speculative_config: str = passed_to(
        CoordinatorConfig,
        "speculative_config",
        "",
        "empty = the draft folder's speculators_config, else the coordinator's default",
    )
    max_num_batched_tokens: int = passed_to(CoordinatorConfig, "max_num_batched_tokens")
    max_num_seqs: int = passed_to(CoordinatorConfig, "max_num_seqs")
    kv_cache_memory: str = passed_to(
        ServiceConfig,
        "kv_cache_memory_bytes",
        "",
        f"empty = room for --max-num-seqs (at least {MIN_DEFAULT_SEQUENCES}) sequences of "
        f"{TYPICAL_SEQUENCE_TOKENS} tokens",
    )
    draft_kv_cache_memory: str = passed_to(
        ServiceConfig,
        "kv_cache_memory_bytes",
        "",
        "the draft's pool; empty = as the target's, for every replica",
    )
    enable_prefix_caching: bool = passed_to(ServiceConfig, "enable_prefix_caching")
    max_queue_len: int = passed_to(CoordinatorConfig, "max_queue_len")
    num_scheduler_steps: int = passed_to(CoordinatorConfig, "num_scheduler_steps")
    pipeline: str = passed_to(CoordinatorConfig, "pipeline")
    speculative_gate: str = passed_to(CoordinatorConfig, "speculative_gate")
    pipeline_branches: int = passed_to(CoordinatorConfig, "pipeline_branches")
    draft_p_min: float = passed_to(
        CoordinatorConfig,
        "draft_p_min",
        -1.0,
        "below 0 = the draft folder's speculators_config, else the coordinator's default",
    )
    host: str = passed_to(CoordinatorConfig, "host")
    port: int = passed_to(CoordinatorConfig, "port")
    target_port: int = passed_to(ServiceConfig, "port")
    draft_port: int = passed_to(ServiceConfig, "port")
    target_num_threads: int = passed_to(
        ServiceConfig,
        "num_threads",
        -1,
        "below 0 = every core, of which a step in which the draft computes leaves it "
        "--draft-num-threads (the coordinator's --target-threads-beside-draft)",
    )
    draft_num_threads: int = passed_to(
        ServiceConfig, "num_threads", 1, "one core for the draft on a CPU host"
    )
    no_draft: bool = field(
        default=False, metadata=_help("target-only serving: no draft service, K = 0 throughout")
    )
    draft_rebuild_every_step: bool = passed_to(CoordinatorConfig, "draft_rebuild_every_step")
    with_baseline: bool = field(
        default=False,
        metadata=_help("also a target-only coordinator on the same target service"),
    )
    metrics_port: int = passed_to(CoordinatorConfig, "metrics_port")
    api_key: str = passed_to(CoordinatorConfig, "api_key")
    tls_cert: str = passed_to(CoordinatorConfig, "tls_cert")
    tls_key: str = passed_to(CoordinatorConfig, "tls_key")
    tls_ca: str = passed_to(CoordinatorConfig, "tls_ca")
    replicas: int = field(
        default=1, metadata=_help("coordinator + target pairs, all sharing the one draft")
    )
    gateway_port: int = field(
        default=0, metadata=_help("the SGLang Model Gateway's OpenAI API on this port; 0 = none")
    )
    gateway_policy: str = field(
        default="round_robin", metadata=_help("smg's --policy across the replicas")
    )
    gateway_metrics_port: int = field(
        default=0, metadata=_help("the gateway's Prometheus /metrics; 0 = any free port")
    )
    served_model_name: str = passed_to(CoordinatorConfig, "served_model_name")
    gateway_admin_key: str = field(
        default="",
        metadata=_help(
            "the gateway's control-plane key; empty = a fresh one per start, kept by this "
            "process (its supervisor re-registers a worker the gateway lost)"
        ),
    )

    def coordinator_config(self, **given: Any) -> CoordinatorConfig:
        """A coordinator of this stack: every knob passed to it, ``given`` (its addresses,
        identity and ports) on top."""
        values = {
            f.metadata["passed_to"][1]: getattr(self, f.name)
            for f in fields(self)
            if f.metadata.get("passed_to", (None,))[0] is CoordinatorConfig
        }
        values["tokenizer"] = self.tokenizer or str(model_folder(self.target_model))
        values["target_threads_beside_draft"] = self.target_threads_beside_draft
        return CoordinatorConfig(**{**values, **given})

    @property
    def resolved_target_num_threads(self) -> int:
        """The target service's threads (0: every core): ``--target-num-threads``, or
        below 0 every core."""
        return max(self.target_num_threads, 0)

    @property
    def target_threads_beside_draft(self) -> int:
        """The target's threads in a step in which the draft computes on the same host
        (0: all): with ``--target-num-threads`` below 0, the cores the draft's threads
        leave it, at least one; else all it was given (the flag says what it may use)."""
        if self.target_num_threads >= 0 or self.no_draft:
            return 0
        return max((os.cpu_count() or 1) - self.draft_num_threads, 1)

    def service_config(self, service: str, model: str, port: int) -> ServiceConfig:
        """The ``service`` ("target" or "draft") serving ``model`` on ``port``."""
        target = service == "target"
        memory = self.kv_cache_memory if target else self.draft_kv_cache_memory
        sequences = max(self.max_num_seqs, MIN_DEFAULT_SEQUENCES) * (1 if target else self.replicas)
        block_size = _SERVICE_DEFAULTS["block_size"]
        pages = None if memory else -(-sequences * TYPICAL_SEQUENCE_TOKENS // block_size)
        tls = (
            {"tls_cert": self.tls_cert, "tls_key": self.tls_key, "tls_ca": self.tls_ca}
            if self.tls_ca  # mutual TLS on the internal hops
            else {}
        )
        return ServiceConfig(
            model=model,
            host=self.host,
            port=port,
            kv_cache_dtype=self.kv_cache_dtype,
            dtype=self.dtype if target else draft_dtype(model, self.draft_dtype, self.dtype),
            quantization=_SERVICE_DEFAULTS["quantization"] if target else self.draft_quantization,
            num_threads=self.resolved_target_num_threads if target else self.draft_num_threads,
            enable_prefix_caching=self.enable_prefix_caching,
            kv_cache_memory_bytes=parse_size(memory) if memory else None,
            num_gpu_blocks_override=pages,
            **tls,
        )


def command_line(module: str, config: Any) -> list[str]:
    """``python -m module`` with the flags that give ``config``."""
    import sys

    return [sys.executable, "-m", module, *to_argv(config)]


def model_folder(model: str) -> Path:
    """The folder of a model path: itself, or for a file (a .gguf) the folder it is in."""
    path = Path(model)
    return path.parent if path.is_file() else path


def has_model_files(model: str) -> bool:
    """A .gguf file, or a folder with a config.json or a .gguf in it."""
    path = Path(model)
    if path.is_file():
        return path.suffix == ".gguf"
    return (path / "config.json").is_file() or any(path.glob("*.gguf"))


def draft_dtype(draft_model: str, requested: str, dtype: str) -> str:
    """The dtype the draft service loads ``draft_model`` in: ``requested``, or for "auto"
    the checkpoint's own (``config.json`` ``torch_dtype``) when it is 16-bit, else ``dtype``
    (a GGUF's blocks are widened to float32 as they are read whatever it is)."""
    config_file = Path(draft_model) / "config.json"
    if requested != "auto" or not config_file.is_file():
        return requested if requested != "auto" else dtype
    config = json.loads(config_file.read_text())
    stored = config.get("torch_dtype") or config.get("dtype")
    return stored if stored in ("bfloat16", "float16") else dtype


def tuned_speculation(folder: Path) -> dict:
    """The ``speculators_config`` of the draft in ``folder`` ({} when it has none)."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        return {}
    return json.loads(config_file.read_text()).get(SPECULATORS_CONFIG) or {}


_COORDINATOR_DEFAULTS = {f.name: f.default for f in fields(CoordinatorConfig)}


def draft_speculation(config: StackConfig) -> StackConfig:
    """``config`` with its speculative settings filled in where the flags left them unset:
    from the draft folder's config.json (``speculators_config``: the settings measured
    best for that draft, so each draft runs with its own), else the coordinator's
    defaults."""
    tuned = {} if config.no_draft else tuned_speculation(model_folder(config.draft_model))
    spec = tuned.get("speculative_config")
    default_spec = _COORDINATOR_DEFAULTS["speculative_config"]
    return replace(
        config,
        speculative_config=config.speculative_config
        or (json.dumps(spec) if spec is not None else default_spec),
        draft_p_min=config.draft_p_min
        if config.draft_p_min >= 0
        else float(tuned.get("draft_p_min", _COORDINATOR_DEFAULTS["draft_p_min"])),
    )
