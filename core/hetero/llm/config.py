"""A Hugging Face ``config.json`` read into a checked dataclass: what the model builders need, nothing more."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract.errors import ModelFormatError
from . import files
from .fields import Fields

# architectures (config.json "architectures") and model types -> hetero family name
ARCHITECTURES = {
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    # hybrid linear-attention families (Gated DeltaNet + gated full attention), hetero.llm.families.qwen3_5
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
}
MODEL_TYPES = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "qwen3_next": "qwen3_next",
               "qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5", "qwen3_5_moe": "qwen3_5_moe",
               "qwen3_5_moe_text": "qwen3_5_moe"}
HYBRID_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters, resolved (defaults filled in) into the RotaryEmbedding op's attributes."""

    theta: float = 10000.0
    rotary_dim: int = 0  # 0: the whole head
    scaling: str = "none"  # none | linear | yarn
    factor: float = 1.0
    original_max_position: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0

    def attrs(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {"theta": self.theta, "rotary_dim": self.rotary_dim, "scaling": self.scaling}
        if self.scaling != "none":
            attrs["factor"] = self.factor
        if self.scaling == "yarn":
            attrs.update(original_max_position=self.original_max_position, beta_fast=self.beta_fast,
                         beta_slow=self.beta_slow, truncate=int(self.truncate), attention_factor=self.attention_factor)
        return attrs


@dataclass(frozen=True)
class LlmConfig:
    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    torch_dtype: str = "float32"
    # mixture of experts (qwen3_moe)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # hybrid families (qwen3_next, qwen3_5, qwen3_5_moe): "linear_attention" / "full_attention" per layer
    layer_types: tuple[str, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    attn_output_gate: bool = False  # q projection doubled: per head [query, gate], output * sigmoid(gate)
    shared_expert_intermediate_size: int = 0  # MoE layers add a shared expert, gated by sigmoid(x @ w)
    norm_offset: float = 0.0  # RMSNorm scales by (offset + weight): 1.0 for zero-centred norm weights

    def is_moe_layer(self, layer: int) -> bool:
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % max(self.decoder_sparse_step, 1) == 0)

    def is_linear_layer(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "linear_attention"


def read_json(path: Path, root: Path | None = None) -> dict[str, Any]:
    """A model folder's JSON file, read safely (``files.read_json``: regular, size-capped, bounded nesting)."""
    return files.read_json(path, files.MAX_JSON_BYTES, root)


def family_of(data: dict[str, Any], path: Path) -> str:
    archs = data.get("architectures") or []
    for arch in archs if isinstance(archs, list) else []:
        if isinstance(arch, str) and arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    model_type = data.get("model_type")
    if isinstance(model_type, str) and model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    named = archs or model_type
    raise ModelFormatError(
        f"{path}: architecture {str(named)[:200]!r} is not supported (key 'architectures' / 'model_type')",
        hint=f"hetero runs {sorted(ARCHITECTURES)}",
    )


def load_config(folder: str | Path) -> LlmConfig:
    """Read ``folder/config.json``; unknown architectures and missing, ill-typed or absurd keys raise
    ModelFormatError."""
    folder = Path(folder)
    path = folder / "config.json"
    data = read_json(path, files.model_root(folder) if folder.is_dir() else None)
    return parse_config(data, path)


def parse_config(data: dict[str, Any], path: Path = Path("config.json")) -> LlmConfig:
    family = family_of(data, path)
    if family in HYBRID_FAMILIES:
        return _parse_hybrid(data, path, family)
    r = Fields(data, path)
    hidden, heads, kv_heads, head_dim = attention_sizes(r)
    max_pos = r.int("max_position_embeddings", 32768, bound="positions")
    layers = r.int("num_hidden_layers", bound="layers")
    moe = family == "qwen3_moe"
    attention_bias = r.bool("attention_bias", False)
    mlp_only = data.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) and 0 <= i < layers for i in mlp_only):
        raise r.fail("mlp_only_layers", f"a list of layer indices below {layers}")
    bos = data.get("bos_token_id")
    return LlmConfig(
        family=family,
        vocab_size=r.int("vocab_size", bound="vocab"),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=r.int("intermediate_size", bound="intermediate"),
        rms_norm_eps=r.float("rms_norm_eps", 1e-6),
        rope=_rope(r, head_dim, max_pos),
        max_position_embeddings=max_pos,
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        qkv_bias=family == "qwen2" or attention_bias,
        o_bias=family != "qwen2" and attention_bias,
        qk_norm=family in ("qwen3", "qwen3_moe"),
        torch_dtype=str(data.get("dtype") or data.get("torch_dtype") or "float32")[:32],
        num_experts=_num_experts(data, r) if moe else 0,
        num_experts_per_tok=r.int("num_experts_per_tok", bound="experts") if moe else 0,
        moe_intermediate_size=r.int("moe_intermediate_size", bound="intermediate") if moe else 0,
        norm_topk_prob=r.bool("norm_topk_prob", True) if moe else True,
        decoder_sparse_step=r.int("decoder_sparse_step", 1, bound="layers") if moe else 1,
        mlp_only_layers=tuple(mlp_only),
        eos_token_ids=r.token_ids("eos_token_id"),
        bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) and 0 <= bos < 1 << 31 else None,
        raw=data,
    )


def attention_sizes(r: Fields) -> tuple[int, int, int, int]:
    """hidden_size, num_attention_heads, num_key_value_heads and head_dim, checked against each other (also read
    from the speculative drafters' configs)."""
    hidden, heads = r.int("hidden_size", bound="hidden"), r.int("num_attention_heads", bound="heads")
    kv_heads = r.int("num_key_value_heads", heads, bound="heads")
    if heads % kv_heads:
        raise r.fail("num_key_value_heads", f"a divisor of num_attention_heads ({heads})")
    if r.get("head_dim") is None and hidden % heads:
        raise r.fail("hidden_size", f"a multiple of num_attention_heads ({heads}) when head_dim is not given")
    return hidden, heads, kv_heads, r.int("head_dim", hidden // heads, bound="head_dim")


def _num_experts(data: dict[str, Any], r: Fields) -> int:
    # transformers 5 writes "num_local_experts" where checkpoints on the Hub say "num_experts"
    key = "num_local_experts" if "num_experts" not in data and "num_local_experts" in data else "num_experts"
    return r.int(key, bound="experts")


def build_rope(where: Path | str, head_dim: int, *, theta: float, rotary_dim: int, kind: str, factor: float = 1.0,
               original: int = 0, attention_factor: float = 0.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
               truncate: bool = True) -> RopeConfig:
    """The one place a RopeConfig is made, from either format's values (already type-checked by ``Fields``).
    kind: "none" / "default", "linear" or "yarn"; attention_factor 0 means YaRN's default for ``factor``."""
    if attention_factor < 0:
        raise ModelFormatError(f"{where}: attention factor {attention_factor!r} must not be negative")
    if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
        raise ModelFormatError(f"{where}: rotary dimension {rotary_dim} must be even and in (0, {head_dim}]")
    base = RopeConfig(theta=theta, rotary_dim=0 if rotary_dim == head_dim else rotary_dim)
    if kind in ("none", "default"):
        return base
    if not math.isfinite(factor) or factor <= 0:
        raise ModelFormatError(f"{where}: {kind} scaling needs a positive finite factor, got {factor!r}")
    if kind == "linear":
        return RopeConfig(base.theta, base.rotary_dim, "linear", factor)
    if kind != "yarn":
        raise ModelFormatError(f"{where}: rope_type {kind!r} is not supported",
                               hint="hetero knows none (default), linear and yarn")
    return RopeConfig(base.theta, base.rotary_dim, "yarn", factor, original, beta_fast, beta_slow, truncate,
                      attention_factor or _yarn_mscale(factor))


def _rope(r: Fields, head_dim: int, max_pos: int) -> RopeConfig:
    # transformers 4 writes "rope_theta" + "rope_scaling"; transformers 5 writes everything in "rope_parameters".
    params = {**r.object("rope_scaling"), **r.object("rope_parameters")}
    p = Fields({**r.values, **params}, f"{r.path}: rope parameters")
    theta = p.float("rope_theta", 10000.0, above=1)
    partial = p.float("partial_rotary_factor", 1.0, above=0)
    if partial > 1:
        raise p.fail("partial_rotary_factor", "in (0, 1]")
    rotary_dim = int(head_dim * partial)
    rotary_dim -= rotary_dim % 2
    kind = params.get("rope_type", params.get("type", "default"))
    if not isinstance(kind, str):
        raise p.fail("rope_type", "a string")
    if kind not in ("yarn", "linear"):
        return build_rope(p.path, head_dim, theta=theta, rotary_dim=rotary_dim, kind=kind)
    factor = params.get("factor")
    original = p.int("original_max_position_embeddings", max_pos, bound="positions") if kind == "yarn" else 0
    if kind == "yarn" and factor is None:
        factor = max_pos / original
    factor = Fields({"factor": factor}, p.path).float("factor", above=0)
    attention = 0.0
    if kind == "yarn":
        attention = p.float("attention_factor", 0.0)
        mscale, mscale_all = p.float("mscale", 0.0), p.float("mscale_all_dim", 0.0)
        if not attention and mscale and mscale_all:
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
    return build_rope(p.path, head_dim, theta=theta, rotary_dim=rotary_dim, kind=kind, factor=factor,
                      original=original, attention_factor=attention,
                      beta_fast=p.float("beta_fast", 32.0) or 32.0, beta_slow=p.float("beta_slow", 1.0) or 1.0,
                      truncate=bool(params.get("truncate", True)))


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature: sqrt(1/t) = 0.1 ln(s) + 1 for a context extended s times."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _parse_hybrid(data: dict[str, Any], path: Path, family: str) -> LlmConfig:
    """Qwen3-Next / Qwen3.5 (dense or MoE): the text config (nested ``text_config`` in the multimodal checkpoints)
    with the common keys, plus the layer pattern and the Gated DeltaNet shapes."""
    import dataclasses

    text = Fields(data, path).object("text_config")
    merged = {**data, **text}
    for key in ("eos_token_id", "bos_token_id", "tie_word_embeddings"):  # top-level values win where both exist
        if key in data and key not in text:
            merged[key] = data[key]
    r = Fields(merged, path)
    experts = merged.get("num_experts", merged.get("num_local_experts", 0))
    moe = family != "qwen3_5" and isinstance(experts, int) and experts > 0
    base = {**merged, "architectures": ["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"]}
    base.pop("model_type", None)
    if moe:
        base.setdefault("intermediate_size", r.int("moe_intermediate_size", bound="intermediate"))
        if family == "qwen3_5_moe":  # every layer routed, always renormalised
            base.update(decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    cfg = parse_config(base, path)
    layers = cfg.num_layers
    types = merged.get("layer_types")
    if types is None:
        interval = r.int("full_attention_interval", 4, bound="layers")
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or \
            any(t not in ("linear_attention", "full_attention") for t in types):
        raise r.fail("layer_types", f"a list of {layers} entries, each 'linear_attention' or 'full_attention'")
    kh, vh = r.int("linear_num_key_heads", bound="heads"), r.int("linear_num_value_heads", bound="heads")
    if vh % kh:
        raise r.fail("linear_num_value_heads", f"a multiple of linear_num_key_heads ({kh})")
    return dataclasses.replace(
        cfg, family=family, raw=data, qk_norm=True,
        layer_types=tuple(types), linear_num_key_heads=kh, linear_num_value_heads=vh,
        linear_key_head_dim=r.int("linear_key_head_dim", bound="head_dim"),
        linear_value_head_dim=r.int("linear_value_head_dim", bound="head_dim"),
        linear_conv_kernel_dim=r.int("linear_conv_kernel_dim", 4, bound="conv_kernel"), attn_output_gate=True,
        shared_expert_intermediate_size=r.int("shared_expert_intermediate_size", 0, minimum=0,
                                              bound="intermediate") if moe else 0,
        norm_offset=1.0,
    )
