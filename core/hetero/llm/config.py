"""A Hugging Face ``config.json`` read into a checked dataclass: what the model builders need, nothing more."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract.errors import ModelFormatError

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


class _Reader:
    """Typed access to config keys; every problem names the key and the file."""

    def __init__(self, data: dict[str, Any], path: Path) -> None:
        self.data, self.path = data, path

    def fail(self, key: str, expected: str) -> ModelFormatError:
        got = self.data.get(key, "<missing>")
        return ModelFormatError(f"{self.path}: key {key!r} must be {expected}, got {got!r}")

    def int(self, key: str, default: int | None = None, *, positive: bool = True) -> int:
        value = self.data.get(key, default)
        if value is None:
            raise ModelFormatError(f"{self.path}: required key {key!r} is missing")
        if isinstance(value, bool) or not isinstance(value, int) or (positive and value < 1):
            raise self.fail(key, "a positive integer" if positive else "an integer")
        return value

    def float(self, key: str, default: float | None = None) -> float:
        value = self.data.get(key, default)
        if value is None:
            raise ModelFormatError(f"{self.path}: required key {key!r} is missing")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, "a number")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, "true or false")
        return value


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFormatError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path}: expected a JSON object")
    return data


def family_of(data: dict[str, Any], path: Path) -> str:
    archs = data.get("architectures") or []
    for arch in archs if isinstance(archs, list) else []:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    model_type = data.get("model_type")
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    named = archs or model_type
    raise ModelFormatError(
        f"{path}: architecture {named!r} is not supported (key 'architectures' / 'model_type')",
        hint=f"hetero runs {sorted(ARCHITECTURES)}",
    )


def load_config(folder: str | Path) -> LlmConfig:
    """Read ``folder/config.json``; unknown architectures and missing or ill-typed keys raise ModelFormatError."""
    path = Path(folder) / "config.json"
    data = read_json(path)
    return parse_config(data, path)


def parse_config(data: dict[str, Any], path: Path = Path("config.json")) -> LlmConfig:
    family = family_of(data, path)
    if family in HYBRID_FAMILIES:
        return _parse_hybrid(data, path, family)
    r = _Reader(data, path)
    hidden, heads = r.int("hidden_size"), r.int("num_attention_heads")
    kv_heads = r.int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise r.fail("num_key_value_heads", f"a divisor of num_attention_heads ({heads})")
    if data.get("head_dim") is None and hidden % heads:
        raise r.fail("hidden_size", f"a multiple of num_attention_heads ({heads}) when head_dim is not given")
    head_dim = r.int("head_dim", hidden // heads)
    max_pos = r.int("max_position_embeddings", 32768)
    moe = family == "qwen3_moe"
    attention_bias = r.bool("attention_bias", False)
    mlp_only = data.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
        raise r.fail("mlp_only_layers", "a list of layer indices")
    return LlmConfig(
        family=family,
        vocab_size=r.int("vocab_size"),
        hidden_size=hidden,
        num_layers=r.int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=r.int("intermediate_size"),
        rms_norm_eps=r.float("rms_norm_eps", 1e-6),
        rope=_rope(data, r, head_dim, max_pos),
        max_position_embeddings=max_pos,
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        qkv_bias=family == "qwen2" or attention_bias,
        o_bias=family != "qwen2" and attention_bias,
        qk_norm=family in ("qwen3", "qwen3_moe"),
        torch_dtype=str(data.get("dtype") or data.get("torch_dtype") or "float32"),
        num_experts=_num_experts(data, r) if moe else 0,
        num_experts_per_tok=r.int("num_experts_per_tok") if moe else 0,
        moe_intermediate_size=r.int("moe_intermediate_size") if moe else 0,
        norm_topk_prob=r.bool("norm_topk_prob", True) if moe else True,
        decoder_sparse_step=r.int("decoder_sparse_step", 1) if moe else 1,
        mlp_only_layers=tuple(mlp_only),
        eos_token_ids=_ids(data.get("eos_token_id"), path, "eos_token_id"),
        bos_token_id=data.get("bos_token_id") if isinstance(data.get("bos_token_id"), int) else None,
        raw=data,
    )


def _num_experts(data: dict[str, Any], r: _Reader) -> int:
    # transformers 5 writes "num_local_experts" where checkpoints on the Hub say "num_experts"
    return r.int("num_local_experts") if "num_experts" not in data and "num_local_experts" in data \
        else r.int("num_experts")


def _ids(value: Any, path: Path, key: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ModelFormatError(f"{path}: key {key!r} must be a token id or a list of them, got {value!r}")
    return tuple(values)


def _rope(data: dict[str, Any], r: _Reader, head_dim: int, max_pos: int) -> RopeConfig:
    # transformers 4 writes "rope_theta" + "rope_scaling"; transformers 5 writes everything in "rope_parameters".
    params: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = data.get(key)
        if value is not None and not isinstance(value, dict):
            raise r.fail(key, "an object")
        params.update(value or {})
    where = f"{r.path}: rope parameters"
    theta = params.get("rope_theta", data.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", data.get("partial_rotary_factor", 1.0))
    if not isinstance(theta, (int, float)) or theta <= 1:
        raise ModelFormatError(f"{where}: rope_theta {theta!r} must be a number above 1")
    if not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ModelFormatError(f"{where}: partial_rotary_factor {partial!r} must be in (0, 1]")
    rotary_dim = int(head_dim * partial)
    rotary_dim -= rotary_dim % 2
    kind = params.get("rope_type", params.get("type", "default"))
    base = RopeConfig(theta=float(theta), rotary_dim=0 if rotary_dim == head_dim else rotary_dim)
    if kind == "default":
        return base
    factor = params.get("factor")
    if kind == "linear":
        if not isinstance(factor, (int, float)) or factor <= 0:
            raise ModelFormatError(f"{where}: linear scaling needs a positive 'factor', got {factor!r}")
        return RopeConfig(base.theta, base.rotary_dim, "linear", float(factor))
    if kind != "yarn":
        raise ModelFormatError(f"{where}: rope_type {kind!r} is not supported", hint="hetero knows default, linear "
                               "and yarn")
    original = params.get("original_max_position_embeddings") or data.get("original_max_position_embeddings")
    original = int(original or max_pos)
    if factor is None:
        factor = max_pos / original
    factor = float(factor)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        else:
            attention_factor = _yarn_mscale(factor)
    return RopeConfig(
        base.theta, base.rotary_dim, "yarn", factor, original,
        float(params.get("beta_fast") or 32.0), float(params.get("beta_slow") or 1.0),
        bool(params.get("truncate", True)), float(attention_factor),
    )


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature: sqrt(1/t) = 0.1 ln(s) + 1 for a context extended s times."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _parse_hybrid(data: dict[str, Any], path: Path, family: str) -> LlmConfig:
    """Qwen3-Next / Qwen3.5 (dense or MoE): the text config (nested ``text_config`` in the multimodal checkpoints)
    with the common keys, plus the layer pattern and the Gated DeltaNet shapes."""
    import dataclasses

    text = data.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ModelFormatError(f"{path}: key 'text_config' must be an object")
    merged = {**data, **(text or {})}
    for key in ("eos_token_id", "bos_token_id", "tie_word_embeddings"):  # top-level values win where both exist
        if key in data and key not in (text or {}):
            merged[key] = data[key]
    r = _Reader(merged, path)
    experts = merged.get("num_experts", merged.get("num_local_experts", 0))
    moe = family != "qwen3_5" and isinstance(experts, int) and experts > 0
    base = {**merged, "architectures": ["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"]}
    base.pop("model_type", None)
    if moe:
        base.setdefault("intermediate_size", r.int("moe_intermediate_size"))
        if family == "qwen3_5_moe":  # every layer routed, always renormalised
            base.update(decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    cfg = parse_config(base, path)
    layers = cfg.num_layers
    types = merged.get("layer_types")
    if types is None:
        interval = r.int("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or \
            any(t not in ("linear_attention", "full_attention") for t in types):
        raise r.fail("layer_types", f"a list of {layers} entries, each 'linear_attention' or 'full_attention'")
    kh, vh = r.int("linear_num_key_heads"), r.int("linear_num_value_heads")
    if vh % kh:
        raise r.fail("linear_num_value_heads", f"a multiple of linear_num_key_heads ({kh})")
    return dataclasses.replace(
        cfg, family=family, raw=data, qk_norm=True,
        layer_types=tuple(types), linear_num_key_heads=kh, linear_num_value_heads=vh,
        linear_key_head_dim=r.int("linear_key_head_dim"), linear_value_head_dim=r.int("linear_value_head_dim"),
        linear_conv_kernel_dim=r.int("linear_conv_kernel_dim", 4), attn_output_gate=True,
        shared_expert_intermediate_size=r.int("shared_expert_intermediate_size", 0, positive=False) if moe else 0,
        norm_offset=1.0,
    )
