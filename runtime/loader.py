"""Build a ``CausalLM`` from a local Hugging Face folder: the one place names are mapped."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from specdec.runtime.gguf_file import KV_SCALES_FILE, GGUFCheckpoint, is_gguf
from specdec.runtime.kv_scales import KVScaleTable
from specdec.runtime.model import CausalLM, GGUFEmbedding, Linear
from specdec.runtime.model_config import ModelConfig

# checkpoint module name -> (packed module name, shard id)
PACKED_MODULES_MAPPING: dict[str, tuple[str, str]] = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
# Per-layer FP8 KV scales, named as vLLM reads them.
KV_SCALE_PATTERN = re.compile(r"^model\.layers\.(\d+)\.self_attn\.([kv])_scale$")
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def kv_scale_tensors(table: KVScaleTable) -> dict[str, torch.Tensor]:
    """The table as checkpoint tensors: scalar float32, named as ``KV_SCALE_PATTERN`` reads."""
    tensors = {}
    for i, (k, v) in enumerate(zip(table.k_scale, table.v_scale, strict=True)):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(k, dtype=torch.float32)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(v, dtype=torch.float32)
    return tensors


def iterate_checkpoint(folder: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in the folder's ``*.safetensors`` files, in file order."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {str(folder)!r}")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, f.get_tensor(name)


def build_model(
    config: ModelConfig,
    max_positions: int,
    dtype: torch.dtype,
    device: str | torch.device,
    without_linears: bool = False,
) -> CausalLM:
    """An uninitialised model (weights are garbage until ``load_weights``);
    ``without_linears``: no memory for the linears' and the embedding's float weights (a
    GGUF file's blocks take their place)."""
    with torch.device("meta"):
        model = CausalLM(config, max_positions)
    if without_linears:
        for module in model.modules():
            if isinstance(module, Linear):
                module.weight = None
        model.model.embed_tokens = torch.nn.Identity()
    model = model.to_empty(device=device).to(dtype)
    model.model.rotary_emb.init_buffers(device)
    return model


def load_weights(
    model: CausalLM, weights: Iterator[tuple[str, torch.Tensor]]
) -> dict[tuple[int, str], float]:
    """Copy checkpoint tensors into ``model``; return its KV scales ``{(layer, "k"|"v"): s}``.

    Raises ``ValueError`` for an unknown tensor, a shape mismatch, or a parameter the
    checkpoint leaves unset (``lm_head`` may be absent when embeddings are tied).
    """
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    loaded: set[str] = set()
    kv_scales: dict[tuple[int, str], float] = {}
    tied = model.config.tie_word_embeddings
    for name, tensor in weights:
        if match := KV_SCALE_PATTERN.match(name):
            kv_scales[(int(match[1]), match[2])] = float(tensor.float().reshape(-1)[0])
            continue
        if name.endswith(IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue
        module_name, _, param_name = name.rpartition(".")
        parent, _, leaf = module_name.rpartition(".")
        shard_id = ""
        if leaf in PACKED_MODULES_MAPPING:
            packed_leaf, shard_id = PACKED_MODULES_MAPPING[leaf]
            module_name = f"{parent}.{packed_leaf}"
        module = modules.get(module_name)
        target = f"{module_name}.{param_name}"
        if target not in params or (shard_id and not isinstance(module, Linear)):
            raise ValueError(f"checkpoint tensor {name!r} has no parameter to load into")
        if isinstance(module, Linear):
            try:
                module.load(param_name, tensor, shard_id)
            except ValueError as error:
                raise ValueError(f"{name}: {error}") from None
            loaded.add(f"{target}:{shard_id}" if shard_id else target)
            continue
        if params[name].shape != tensor.shape:
            raise ValueError(
                f"{name}: expected {tuple(params[name].shape)}, got {tuple(tensor.shape)}"
            )
        params[name].data.copy_(tensor)
        loaded.add(name)
    missing = [n for n in _expected_names(model) if n not in loaded]
    if missing:
        raise ValueError(f"checkpoint does not set {len(missing)} parameters, e.g. {missing[:5]}")
    model.finalize()
    return kv_scales


def _expected_names(model: CausalLM) -> Iterator[str]:
    tied = model.config.tie_word_embeddings
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if tied and full == "lm_head.weight":
                continue
            if isinstance(module, Linear):
                yield from (f"{full}:{shard}" if shard else full for shard in module.shards)
            else:
                yield full


def load_gguf_weights(model: CausalLM, checkpoint: GGUFCheckpoint) -> None:
    """The GGUF's linears and embedding as GGUF blocks (q/k/v and gate/up stacked, a tied
    head sharing the embedding's), every other tensor as float32 parameters."""
    params = dict(model.named_parameters())
    for name, tensor in checkpoint.tensors.items():
        if name in params:
            if (expected := tuple(params[name].shape)) != tensor.shape:
                raise ValueError(f"{name}: expected {expected}, got {tensor.shape}")
            params[name].data.copy_(checkpoint.float_tensor(name))
        elif name.endswith(".bias"):  # q/k/v biases: a packed linear's bias shards
            module_name, _, _ = name.rpartition(".")
            parent, _, leaf = module_name.rpartition(".")
            packed, shard = PACKED_MODULES_MAPPING.get(leaf, (leaf, ""))
            linear = model.get_submodule(f"{parent}.{packed}")
            linear.load("bias", checkpoint.float_tensor(name), shard)
    embedding = checkpoint.gguf_weight(["model.embed_tokens.weight"])
    model.model.embed_tokens = GGUFEmbedding(embedding)
    tied = "lm_head.weight" not in checkpoint.tensors
    model.lm_head.hold_gguf(embedding if tied else checkpoint.gguf_weight(["lm_head.weight"]))
    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        stacks = {
            attn.qkv_proj: ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            attn.o_proj: ["self_attn.o_proj"],
            mlp.gate_up_proj: ["mlp.gate_proj", "mlp.up_proj"],
            mlp.down_proj: ["mlp.down_proj"],
        }
        for linear, names in stacks.items():
            linear.hold_gguf(checkpoint.gguf_weight([f"{p}{n}.weight" for n in names]))
    model.finalize()


def gguf_kv_scales(path: Path) -> dict[tuple[int, str], float]:
    """The FP8 KV scales in ``kv_scales.json`` beside a GGUF file (none without one)."""
    scales_file = path.parent / KV_SCALES_FILE
    if not scales_file.is_file():
        return {}
    table = KVScaleTable.load(scales_file)
    pairs = enumerate(zip(table.k_scale, table.v_scale, strict=True))
    return {key: value for i, (k, v) in pairs for key, value in (((i, "k"), k), ((i, "v"), v))}


def load_model(
    path: str | Path,
    config: ModelConfig,
    max_positions: int,
    dtype: torch.dtype,
    device: str | torch.device,
) -> tuple[CausalLM, dict[tuple[int, str], float]]:
    """Build and load the model in ``path`` (a Hugging Face folder, a GGUF file or a folder
    holding one); returns it (eval mode) and its KV scales."""
    if is_gguf(path):
        checkpoint = GGUFCheckpoint(path)
        model = build_model(config, max_positions, dtype, device, without_linears=True)
        load_gguf_weights(model, checkpoint)
        return model.eval(), gguf_kv_scales(checkpoint.path)
    model = build_model(config, max_positions, dtype, device)
    kv_scales = load_weights(model, iterate_checkpoint(path))
    return model.eval(), kv_scales


def load_tokenizer(path: str | Path):
    """The tokenizer saved beside the checkpoint (offline)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


class SubsetHead(torch.nn.Module):
    """A frequency-ranked head as transformers needs it: scores at ``token_ids``, the
    dtype's lowest value elsewhere, ``[..., vocab_size]`` (the runtime's ``-inf`` rule)."""

    def __init__(self, weight: torch.Tensor, token_ids: list[int], vocab_size: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.register_buffer("token_ids", torch.tensor(token_ids, dtype=torch.int64))
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        scores = hidden @ self.weight.t()
        full = scores.new_full((*scores.shape[:-1], self.vocab_size), torch.finfo(scores.dtype).min)
        return full.index_copy_(-1, self.token_ids, scores)


def load_hf_model(path: str | Path):
    """transformers' model for a checkpoint or a GGUF (offline, eval mode), a frequency-ranked head
    (``head_token_ids``, which transformers cannot load) included: for baselines such as
    assisted generation with the real pair's draft."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if is_gguf(path):
        # transformers dequantises it to float32 (gguf.quants); the config is ours, as its
        # GGUF reader leaves out some keys (Qwen3's head width, attention.key_length).
        checkpoint = GGUFCheckpoint(path)
        config = AutoConfig.for_model(**checkpoint.hf_config)
        return AutoModelForCausalLM.from_pretrained(
            str(checkpoint.path.parent),
            gguf_file=checkpoint.path.name,
            config=config,
            local_files_only=True,
            dtype=torch.float32,
        ).eval()
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    head_ids = getattr(config, "head_token_ids", None)
    if not head_ids:
        return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).eval()
    model = AutoModelForCausalLM.from_config(config)
    state = {k: v for k, v in iterate_checkpoint(path) if not KV_SCALE_PATTERN.match(k)}
    head = state.pop("lm_head.weight")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) != {"lm_head.weight"}:
        raise ValueError(f"{path}: unexpected {unexpected[:3]}, missing {missing[:3]}")
    model.lm_head = SubsetHead(head, head_ids, config.vocab_size)
    return model.eval()
