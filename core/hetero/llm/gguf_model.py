"""A GGUF file as an hetero LLM: the architecture metadata as an ``LlmConfig``, the tensors as a ``WeightSource``
under the Hugging Face names the families use, and the tokenizer and chat template from the file's own vocabulary.

Tensors are used as stored (memory-mapped, no conversion): F32 / F16 / BF16 as float weights, Q8_0 / Q4_0 / Q4_1 as
hetero's ``q8`` / ``q4`` block-32 formats (byte-identical), Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K as the GGUF wtypes of
``hetero.contract.quant``. llama.cpp's converter permutes nothing for the Qwen families (their rotary embedding is the
NeoX layout, as in Hugging Face), so the weights map one to one.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..contract.errors import HeteroError, HeteroWarning, ModelFormatError
from ..contract.quant import GGML_FORMATS, GgmlFormat, QuantFormat, bf16_to_f32, dequantize, quantize
from . import gguf
from .config import LlmConfig, RopeConfig, build_rope
from .fields import Fields
from .files import limit
from .gguf import GGML_BY_NAME, GgufFile
from .sampler import from_gguf
from .weights import Weight, WeightSource

if TYPE_CHECKING:
    from .loader import ModelFiles

# general.architecture -> hetero family
ARCHITECTURES = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe"}
# llama.cpp's hybrid Gated DeltaNet architectures (hetero.llm.families.qwen3_5); see _Hybrid below for their layout
HYBRID_ARCHITECTURES = {"qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe", "qwen3next": "qwen3_next"}
ARCHITECTURES.update(HYBRID_ARCHITECTURES)

# GGUF tensor type -> (node attributes, the format to dequantize with); float types have no format.
_Q = {"Q8_0": QuantFormat(8, 32, True), "Q4_0": QuantFormat(4, 32, True), "Q4_1": QuantFormat(4, 32, False)}
_FORMATS: dict[str, QuantFormat | GgmlFormat] = {**_Q, **{f.ggml: f for f in GGML_FORMATS.values()}}
_FLOAT_WTYPE = {"F32": "f32", "F16": "f16", "BF16": "bf16"}

# general.file_type -> the name llama.cpp gives the mix (for labels only)
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
              12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
              32: "BF16"}

# Hugging Face name (as the family builders ask for it) -> GGUF name
NAMES: list[tuple[re.Pattern[str], str]] = [(re.compile(p), r) for p, r in (
    (r"^model\.embed_tokens\.weight$", "token_embd.weight"),
    (r"^model\.norm\.weight$", "output_norm.weight"),
    (r"^lm_head\.weight$", "output.weight"),
    (r"^model\.layers\.(\d+)\.input_layernorm\.weight$", r"blk.\1.attn_norm.weight"),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.weight$", r"blk.\1.ffn_norm.weight"),
    (r"^model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)$", r"blk.\1.attn_\2.\3"),
    (r"^model\.layers\.(\d+)\.self_attn\.o_proj\.(weight|bias)$", r"blk.\1.attn_output.\2"),
    (r"^model\.layers\.(\d+)\.self_attn\.([qk])_norm\.weight$", r"blk.\1.attn_\2_norm.weight"),
    (r"^model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight$", r"blk.\1.ffn_\2.weight"),
    (r"^model\.layers\.(\d+)\.mlp\.gate\.weight$", r"blk.\1.ffn_gate_inp.weight"),
    (r"^model\.layers\.(\d+)\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$", r"blk.\1.ffn_\2_exps.weight"),
)]


def gguf_name(hf_name: str) -> str | None:
    for pattern, replacement in NAMES:
        if pattern.match(hf_name):
            return pattern.sub(replacement, hf_name)
    return None


# -- config ----------------------------------------------------------------------------------------------------------
def gguf_config(gf: GgufFile) -> LlmConfig:
    """``general.architecture`` and ``<arch>.*`` metadata -> LlmConfig (checked against the tensors)."""
    if gf.metadata_types.get("general.architecture") != gguf.STRING:
        raise ModelFormatError(f"{gf.path}: metadata 'general.architecture' is missing or not a string")
    arch = gf.metadata["general.architecture"]
    family = ARCHITECTURES.get(arch)
    if family is None:
        raise ModelFormatError(f"{gf.path}: general.architecture {arch!r} is not supported",
                               hint=f"hetero runs GGUF architectures {sorted(ARCHITECTURES)}")
    m = Fields(gf.metadata, gf.path, noun="metadata", arch=arch)
    hidden = m.int("{arch}.embedding_length", bound="hidden")
    heads = m.int("{arch}.attention.head_count", bound="heads")
    kv_heads = m.int("{arch}.attention.head_count_kv", heads, bound="heads")
    if heads % kv_heads:
        raise m.fail(m.key("{arch}.attention.head_count_kv"), f"a divisor of the head count {heads}")
    if f"{arch}.attention.key_length" not in gf.metadata and hidden % heads:
        raise m.fail(m.key("{arch}.embedding_length"), f"a multiple of the head count {heads}")
    head_dim = m.int("{arch}.attention.key_length", hidden // heads, bound="head_dim")
    value_dim = m.int("{arch}.attention.value_length", head_dim, bound="head_dim")
    if value_dim != head_dim:
        raise m.fail(m.key("{arch}.attention.value_length"), f"equal to the key length {head_dim}")
    layers = m.int("{arch}.block_count", bound="layers")
    context = m.int("{arch}.context_length", 32768, bound="positions")
    embed = gf.tensors.get("token_embd.weight")
    if embed is None:
        raise ModelFormatError(f"{gf.path}: tensor 'token_embd.weight' is missing")
    if len(embed.dims) != 2 or embed.dims[0] != hidden:
        raise ModelFormatError(f"{gf.path}: tensor 'token_embd.weight' has dims {list(embed.dims)}; expected "
                               f"[{hidden}, vocab] ({arch}.embedding_length = {hidden})")
    vocab = limit(embed.dims[1], "vocab", f"{gf.path}: tensor 'token_embd.weight' dims[1] (vocabulary)")
    moe = family in ("qwen3_moe", "qwen3_5_moe", "qwen3_next")
    experts = m.int("{arch}.expert_count", bound="experts") if moe else 0
    used = m.int("{arch}.expert_used_count", bound="experts") if moe else 0
    if moe and used > experts:
        raise m.fail(m.key("{arch}.expert_used_count"), f"at most the expert count {experts}")
    moe_inter = m.int("{arch}.expert_feed_forward_length", bound="intermediate") if moe else 0
    dense_layers = tuple(i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in gf) if moe else ()
    inter = m.int("{arch}.feed_forward_length", moe_inter if moe and not dense_layers else None, bound="intermediate")
    qkv_bias = family == "qwen2" or "blk.0.attn_q.bias" in gf
    eos = [i for i in (m.token_id("tokenizer.ggml.eos_token_id", vocab),
                       m.token_id("tokenizer.ggml.eot_token_id", vocab),
                       m.token_id("tokenizer.ggml.eom_token_id", vocab)) if i is not None]
    file_type = gf.metadata.get("general.file_type")
    raw = {k: v for k, v in gf.metadata.items() if not isinstance(v, (list, np.ndarray))}
    raw["hetero.file_type"] = FILE_TYPES.get(file_type, "") if isinstance(file_type, int) else ""
    cfg = LlmConfig(
        family=family,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        rms_norm_eps=m.float("{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        rope=_rope(m, head_dim, context),
        max_position_embeddings=context,
        tie_word_embeddings="output.weight" not in gf,
        qkv_bias=qkv_bias,
        o_bias="blk.0.attn_output.bias" in gf,
        qk_norm=family in ("qwen3", "qwen3_moe"),
        torch_dtype=_dominant_type(gf),
        num_experts=experts,
        num_experts_per_tok=used,
        moe_intermediate_size=moe_inter,
        norm_topk_prob=m.bool("{arch}.expert_weights_norm", True) if moe else True,
        decoder_sparse_step=1,
        mlp_only_layers=dense_layers,
        eos_token_ids=tuple(dict.fromkeys(eos)),
        bos_token_id=m.token_id("tokenizer.ggml.bos_token_id", vocab),
        raw=raw,
    )
    return _hybrid_config(gf, m, cfg) if arch in HYBRID_ARCHITECTURES else cfg


def _hybrid_config(gf: GgufFile, m: Fields, cfg: LlmConfig) -> LlmConfig:
    """The Gated DeltaNet fields of qwen35 / qwen35moe / qwen3next files (llama.cpp's ``ssm.*`` keys: conv_kernel,
    state_size = key head size, group_count = key heads, time_step_rank = value heads, inner_size = value heads x
    value head size). A layer is linear attention when its ``ssm_a`` tensor exists (else every
    ``full_attention_interval``-th layer is full attention). Norm weights are stored as llama.cpp's converter
    writes them, already (1 + w): the family's offset is 0 here."""
    hk = m.int("{arch}.ssm.group_count", bound="heads")
    hv = m.int("{arch}.ssm.time_step_rank", bound="heads")
    dk = m.int("{arch}.ssm.state_size", bound="head_dim")
    inner = m.int("{arch}.ssm.inner_size", bound="intermediate")
    if hv % hk:
        raise m.fail(m.key("{arch}.ssm.time_step_rank"), f"a multiple of {m.key('{arch}.ssm.group_count')} ({hk})")
    if inner % hv:
        raise m.fail(m.key("{arch}.ssm.inner_size"), f"a multiple of the value head count {hv}")
    if any(f"blk.{i}.ssm_a" in gf for i in range(cfg.num_layers)):
        types = tuple("linear_attention" if f"blk.{i}.ssm_a" in gf else "full_attention"
                      for i in range(cfg.num_layers))
    else:
        interval = m.int("{arch}.full_attention_interval", 4, bound="layers")
        types = tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention"
                      for i in range(cfg.num_layers))
    moe = cfg.family != "qwen3_5"
    shared = 0
    if moe:
        shexp = gf.tensors.get(next((f"blk.{i}.ffn_gate_shexp.weight" for i in range(cfg.num_layers)
                                     if f"blk.{i}.ffn_gate_shexp.weight" in gf), ""))
        shared = m.int("{arch}.expert_shared_feed_forward_length", shexp.dims[1] if shexp is not None else 0,
                       minimum=0, bound="intermediate")
    extra: dict[str, Any] = {}
    if cfg.family == "qwen3_5_moe":  # every layer routed, always renormalised
        extra = {"decoder_sparse_step": 1, "mlp_only_layers": (), "norm_topk_prob": True}
    return dataclasses.replace(
        cfg, qk_norm=True, layer_types=types, linear_num_key_heads=hk, linear_num_value_heads=hv,
        linear_key_head_dim=dk, linear_value_head_dim=inner // hv,
        linear_conv_kernel_dim=m.int("{arch}.ssm.conv_kernel", 4, bound="conv_kernel"), attn_output_gate=True,
        shared_expert_intermediate_size=shared, norm_offset=0.0, **extra)


def _rope(m: Fields, head_dim: int, context: int) -> RopeConfig:
    kind = m.str("{arch}.rope.scaling.type", "none") or "none"
    factor = m.float("{arch}.rope.scaling.factor", 0.0)
    if kind == "linear" and factor in (0.0, 1.0):
        kind = "none"
    yarn = kind == "yarn"
    return build_rope(
        f"{m.path}: metadata '{m.arch}.rope.*'", head_dim, theta=m.float("{arch}.rope.freq_base", 10000.0, above=1),
        rotary_dim=m.int("{arch}.rope.dimension_count", head_dim, bound="head_dim"), kind=kind, factor=factor,
        original=m.int("{arch}.rope.scaling.original_context_length", context, bound="positions") if yarn else 0,
        attention_factor=m.float("{arch}.rope.scaling.attn_factor", 0.0),
        beta_fast=m.float("{arch}.rope.scaling.yarn_beta_fast", 32.0),
        beta_slow=m.float("{arch}.rope.scaling.yarn_beta_slow", 1.0))


def _dominant_type(gf: GgufFile) -> str:
    """The type that holds most of the weight bytes (a label, e.g. for ``Llm.quant``)."""
    sizes: dict[str, int] = {}
    for info in gf.tensors.values():
        if len(info.dims) >= 2:
            sizes[info.type.name] = sizes.get(info.type.name, 0) + info.nbytes
    return max(sizes, key=sizes.__getitem__) if sizes else "F32"


# -- weights ---------------------------------------------------------------------------------------------------------
class GgufWeights(WeightSource):
    """The tensors of a GGUF file under Hugging Face names, memory-mapped and in their stored types. ``quant``
    (q4 / q8...) quantizes the file's float matrices at load; already-quantized ones are kept as stored."""

    def __init__(self, gf: GgufFile, quant: QuantFormat | GgmlFormat | None = None) -> None:
        self.gf = gf
        self.quant = quant  # type: ignore[assignment]  # GGUF also keeps ggml formats; WeightSource says QuantFormat
        arch = gf.metadata.get("general.architecture")
        self.hybrid = _Hybrid(gf, arch) if arch in HYBRID_ARCHITECTURES else None

    def _name(self, hf_name: str) -> str:
        name = self.hybrid.name(hf_name) if self.hybrid is not None else gguf_name(hf_name)
        if name is None or name not in self.gf:
            shown = name or hf_name
            raise ModelFormatError(f"{self.gf.path}: tensor {shown!r} is missing (needed for {hf_name!r})")
        return name

    def _checked(self, hf_name: str, shape: tuple[int, ...]) -> gguf.TensorInfo:
        info = self.gf[self._name(hf_name)]
        if info.shape != tuple(shape):
            raise ModelFormatError(f"{self.gf.path}: tensor {info.name!r} has dims {list(info.dims)}; expected "
                                   f"{list(reversed(shape))} (ggml order) from the metadata")
        return info

    def _float32(self, info: gguf.TensorInfo) -> np.ndarray:
        data = self.gf.array(info.name)
        t = info.type.name
        if t == "F32":
            return data
        if t in ("F16", "F64"):
            return data.astype(np.float32)
        if t == "BF16":
            return bf16_to_f32(data)
        fmt = _FORMATS.get(t)
        if fmt is None:
            raise _unsupported(self.gf, info)
        return dequantize(data, fmt, info.dims[0])

    def _stored(self, info: gguf.TensorInfo) -> Weight:
        """A matrix (or stacked matrices) as a node consumes it: the stored bytes and their wtype attributes."""
        t = info.type.name
        data = self.gf.array(info.name)
        if t in _FLOAT_WTYPE:
            if self.quant is not None:
                values = bf16_to_f32(data) if t == "BF16" else data
                return Weight(quantize(values, self.quant), self.quant.attrs())
            return Weight(data, {"wtype": _FLOAT_WTYPE[t]})
        fmt = _FORMATS.get(t)
        if fmt is None:
            if t == "F64":
                return Weight(data.astype(np.float32), {"wtype": "f32"})
            raise _unsupported(self.gf, info)
        return Weight(data, fmt.attrs())

    # -- WeightSource ---------------------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        if self.hybrid is not None:
            return self.hybrid.has(name)
        mapped = gguf_name(name)
        return mapped is not None and mapped in self.gf

    def vector(self, name: str, n: int) -> np.ndarray:
        if self.hybrid is not None:
            special = self.hybrid.vector(self, name, n)
            if special is not None:
                return special
        return self._float32(self._checked(name, (n,)))

    def matrix(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if self.hybrid is not None:
            special = self.hybrid.matrix(self, name, shape)
            if special is not None:
                return special
        return self._float32(self._checked(name, shape))

    def linear(self, name: str, rows: int, cols: int) -> Weight:
        if self.hybrid is not None:
            special = self.hybrid.linear(self, name, rows, cols)
            if special is not None:
                return special
        return self._stored(self._checked(name, (rows, cols)))

    def experts(self, names: list[str], fused: tuple[str, int] | None, rows: int, cols: int) -> Weight:
        info = self._checked(names[0], (len(names), rows, cols))
        weight = self._stored(info)
        match = re.match(r"^blk\.(\d+)\.ffn_gate_exps\.weight$", info.name)
        if match:
            # The MoE node takes the gate's attributes; GGUF files mix types (q4_k gate/up with a q6_k down), so
            # the up and down tensors' formats ride along as up_* / down_* attributes where they differ.
            for part in ("up", "down"):
                other = self.gf.tensors.get(f"blk.{match[1]}.ffn_{part}_exps.weight")
                if other is None:
                    continue
                attrs = self._stored_attrs(other)
                if attrs != weight.attrs:
                    weight.attrs.update({f"{part}_{k}": v for k, v in attrs.items()})
        return weight

    def _stored_attrs(self, info: gguf.TensorInfo) -> dict[str, Any]:
        t = info.type.name
        if t in _FLOAT_WTYPE:
            return dict(self.quant.attrs()) if self.quant is not None else {"wtype": _FLOAT_WTYPE[t]}
        fmt = _FORMATS.get(t)
        return dict(fmt.attrs()) if fmt is not None else {"wtype": "f32"}


# Hugging Face name -> GGUF name for the hybrid architectures (checked before the common table).
HYBRID_NAMES: list[tuple[re.Pattern[str], str]] = [(re.compile(p), r) for p, r in (
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.weight$", r"blk.\1.post_attention_norm.weight"),
    (r"^model\.layers\.(\d+)\.linear_attn\.in_proj_qkv\.weight$", r"blk.\1.attn_qkv.weight"),
    (r"^model\.layers\.(\d+)\.linear_attn\.in_proj_z\.weight$", r"blk.\1.attn_gate.weight"),
    (r"^model\.layers\.(\d+)\.linear_attn\.in_proj_a\.weight$", r"blk.\1.ssm_alpha.weight"),
    (r"^model\.layers\.(\d+)\.linear_attn\.in_proj_b\.weight$", r"blk.\1.ssm_beta.weight"),
    (r"^model\.layers\.(\d+)\.linear_attn\.in_proj_ba\.weight$", r"blk.\1.ssm_ba.weight"),
    (r"^model\.layers\.(\d+)\.linear_attn\.A_log$", r"blk.\1.ssm_a"),
    (r"^model\.layers\.(\d+)\.linear_attn\.dt_bias$", r"blk.\1.ssm_dt.bias"),
    (r"^model\.layers\.(\d+)\.linear_attn\.conv1d\.weight$", r"blk.\1.ssm_conv1d.weight"),
    (r"^model\.layers\.(\d+)\.linear_attn\.norm\.weight$", r"blk.\1.ssm_norm.weight"),
    (r"^model\.layers\.(\d+)\.linear_attn\.out_proj\.weight$", r"blk.\1.ssm_out.weight"),
    (r"^model\.layers\.(\d+)\.mlp\.shared_expert\.(gate|up|down)_proj\.weight$", r"blk.\1.ffn_\2_shexp.weight"),
    (r"^model\.layers\.(\d+)\.mlp\.shared_expert_gate\.weight$", r"blk.\1.ffn_gate_inp_shexp.weight"),
)]
_LINEAR_ATTN = re.compile(r"^model\.layers\.(\d+)\.linear_attn\.(in_proj_qkvz\.weight|in_proj_qkv\.weight|"
                          r"in_proj_z\.weight|in_proj_[ab]\.weight|A_log|dt_bias|conv1d\.weight|out_proj\.weight)$")


class _Hybrid:
    """llama.cpp's layout of Qwen3.5 / Qwen3-Next (its converter's transforms, undone here so that the family
    builder gets Hugging Face tensors):

    * ``ssm_a`` holds -exp(A_log) (A_log = log(-ssm_a)); ``ssm_dt.bias`` is dt_bias; ``ssm_conv1d`` is the conv
      weight squeezed to [C, K]; every ``*norm.weight`` but ``ssm_norm`` is stored as (1 + w) (the config's norm
      offset is 0 for these files); the residual norm after attention is ``post_attention_norm``;
    * qwen35 / qwen35moe: when value heads outnumber key heads (r = Hv / Hk), the value heads are stored tiled
      (position j * Hk + k holds Hugging Face head k * r + j, so that ggml's broadcast repeat pairs them with key
      head k): the V rows of ``attn_qkv``, the rows of ``attn_gate`` / ``ssm_alpha`` / ``ssm_beta``, ``ssm_a``,
      ``ssm_dt``, the V channels of ``ssm_conv1d`` and the input columns of ``ssm_out``. Rows are regrouped in
      their stored type; ``ssm_out``'s columns move as whole quantization blocks when the value head size is a
      multiple of the block, else (k-quants with 128-wide heads) that matrix is dequantized to float32;
    * qwen3next: q | k | v as ``attn_qkv`` (heads contiguous) and z as ``attn_gate`` (newer converters), or the
      Hugging Face interleaved ``ssm_in`` (older files); b / a interleaved per key head as ``ssm_ba``.
    """

    def __init__(self, gf: GgufFile, arch: str) -> None:
        m = Fields(gf.metadata, gf.path, noun="metadata", arch=arch)
        self.gf, self.arch = gf, arch
        self.hk = m.int("{arch}.ssm.group_count", bound="heads")
        self.hv = m.int("{arch}.ssm.time_step_rank", bound="heads")
        self.dk = m.int("{arch}.ssm.state_size", bound="head_dim")
        self.dv = m.int("{arch}.ssm.inner_size", bound="intermediate") // self.hv
        self.tiled = arch in ("qwen35", "qwen35moe") and self.hv != self.hk and self.hv % self.hk == 0

    def name(self, hf_name: str) -> str | None:
        for pattern, replacement in HYBRID_NAMES:
            if pattern.match(hf_name):
                return pattern.sub(replacement, hf_name)
        return gguf_name(hf_name)

    def has(self, hf_name: str) -> bool:
        if hf_name.endswith("linear_attn.in_proj_qkvz.weight"):
            p = hf_name.split(".linear_attn.")[0].replace("model.layers.", "blk.")
            return f"{p}.ssm_in.weight" in self.gf or f"{p}.attn_qkv.weight" in self.gf
        mapped = self.name(hf_name)
        return mapped is not None and mapped in self.gf

    def heads(self, size: int) -> np.ndarray:
        """Stored row of each Hugging Face value-head row (``size`` rows per head): the inverse of the tiling."""
        r = self.hv // self.hk
        h = np.arange(self.hv)
        src = (h % r) * self.hk + h // r
        return (src[:, None] * size + np.arange(size)).reshape(-1)

    def _part(self, hf_name: str) -> str | None:
        match = _LINEAR_ATTN.match(hf_name)
        return match[2] if match else None

    def vector(self, w: GgufWeights, hf_name: str, n: int) -> np.ndarray | None:
        part = self._part(hf_name)
        if part not in ("A_log", "dt_bias"):
            return None
        values = w._float32(w._checked(hf_name, (n,)))
        if part == "A_log":
            if np.any(values >= 0):
                raise ModelFormatError(f"{self.gf.path}: tensor {self.name(hf_name)!r} must hold -exp(A_log) "
                                       "(negative values)")
            values = np.log(-values.astype(np.float64)).astype(np.float32)
        return values[self.heads(1)] if self.tiled else values

    def matrix(self, w: GgufWeights, hf_name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        if self._part(hf_name) == "conv1d.weight":
            channels, kernel = shape[0], shape[-1]
            info = w._checked(hf_name, (channels, kernel)) if len(shape) == 3 else w._checked(hf_name, shape)
            conv = w._float32(info).reshape(channels, kernel)
            if self.tiled:
                qk = 2 * self.hk * self.dk
                conv = np.concatenate([conv[:qk], conv[qk:][self.heads(self.dv)]])
            return conv.reshape(shape)
        if hf_name.endswith("mlp.shared_expert_gate.weight"):
            vector = self.gf.tensors.get(w._name(hf_name))
            if vector is not None and vector.shape == (shape[-1],):  # written as a vector
                return w._float32(vector).reshape(shape)
        return None

    def linear(self, w: GgufWeights, hf_name: str, rows: int, cols: int) -> Weight | None:
        part = self._part(hf_name)
        if part == "in_proj_qkvz.weight":
            return self._qkvz(w, hf_name, rows, cols)
        if not self.tiled or part not in ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_a.weight",
                                          "in_proj_b.weight", "out_proj.weight"):
            return None
        weight = w._stored(w._checked(hf_name, (rows, cols)))
        if part == "out_proj.weight":
            return self._columns(w, hf_name, weight, rows, cols)
        if part == "in_proj_qkv.weight":
            qk = 2 * self.hk * self.dk
            order = np.concatenate([np.arange(qk), qk + self.heads(self.dv)])
        else:
            order = self.heads(self.dv if part == "in_proj_z.weight" else 1)
        return Weight(np.ascontiguousarray(np.take(weight.array, order, axis=0)), dict(weight.attrs))

    def _columns(self, w: GgufWeights, hf_name: str, weight: Weight, rows: int, cols: int) -> Weight:
        order = self.heads(self.dv)
        info = w._checked(hf_name, (rows, cols))
        t = info.type.name
        fmt = _FORMATS.get(t)
        if t in _FLOAT_WTYPE and w.quant is None:
            return Weight(np.ascontiguousarray(weight.array[:, order]), dict(weight.attrs))
        if fmt is not None and w.quant is None and self.dv % fmt.block_size == 0:
            data = weight.array
            blocks = data.reshape(rows, cols // fmt.block_size, -1)
            per_head = self.dv // fmt.block_size
            return Weight(np.ascontiguousarray(blocks[:, self.heads(per_head)].reshape(data.shape)), dict(weight.attrs))
        dense = w._float32(info)[:, order]
        if w.quant is not None:
            return Weight(quantize(np.ascontiguousarray(dense), w.quant), w.quant.attrs())
        return Weight(np.ascontiguousarray(dense), {"wtype": "f32"})

    def _qkvz(self, w: GgufWeights, hf_name: str, rows: int, cols: int) -> Weight:
        """Hugging Face's interleaved in_proj_qkvz ([q, k, v..., z...] per key head) from the file's tensors."""
        p = hf_name.split(".linear_attn.")[0].replace("model.layers.", "blk.")
        legacy = f"{p}.ssm_in.weight"
        if legacy in self.gf:
            return w._stored(self._info(legacy, (rows, cols)))
        qkv, gate = self._info(f"{p}.attn_qkv.weight", None), self._info(f"{p}.attn_gate.weight", None)
        r = self.hv // self.hk
        key, value = self.hk * self.dk, self.hv * self.dv
        if qkv.shape != (2 * key + value, cols) or gate.shape != (value, cols) or rows != 2 * key + 2 * value:
            raise ModelFormatError(f"{self.gf.path}: tensors {qkv.name!r} {list(qkv.dims)} and {gate.name!r} "
                                   f"{list(gate.dims)} do not make the {rows} x {cols} q | k | v | z projection")
        a, b = w._stored(qkv), w._stored(gate)
        if a.attrs == b.attrs:
            both, attrs = np.concatenate([a.array, b.array]), dict(a.attrs)
        else:
            both, attrs = np.concatenate([w._float32(qkv), w._float32(gate)]), {"wtype": "f32"}
        order = []
        for k in range(self.hk):
            order += [np.arange(k * self.dk, (k + 1) * self.dk), key + np.arange(k * self.dk, (k + 1) * self.dk),
                      2 * key + np.arange(k * r * self.dv, (k + 1) * r * self.dv),
                      2 * key + value + np.arange(k * r * self.dv, (k + 1) * r * self.dv)]
        return Weight(np.ascontiguousarray(np.take(both, np.concatenate(order), axis=0)), attrs)

    def _info(self, name: str, shape: tuple[int, int] | None) -> gguf.TensorInfo:
        info = self.gf.tensors.get(name)
        if info is None:
            raise ModelFormatError(f"{self.gf.path}: tensor {name!r} is missing")
        if shape is not None and info.shape != shape:
            raise ModelFormatError(f"{self.gf.path}: tensor {name!r} has dims {list(info.dims)}; expected "
                                   f"{list(reversed(shape))} (ggml order) from the metadata")
        return info


def _unsupported(gf: GgufFile, info: gguf.TensorInfo) -> ModelFormatError:
    known = ", ".join(["F32", "F16", "BF16", *_FORMATS])
    return ModelFormatError(f"{gf.path}: tensor {info.name!r} has type {info.type.name}, which hetero does not run",
                            hint=f"hetero runs {known}; re-quantize the model with one of them")


# -- tokenizer -------------------------------------------------------------------------------------------------------
# Pre-tokenizer split patterns by tokenizer.ggml.pre (the regexes of the Hugging Face tokenizers they came from).
PRE_PATTERNS = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "gpt-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    # Qwen3.5's tokenizer (llama.cpp's converter names it "qwen35"): combining marks stay inside words
    "qwen35": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}
PRE_ALIASES = {"default": "gpt-2", "gpt2": "gpt-2", "llama3": "llama-bpe", "llama-v3": "llama-bpe"}
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
# Texts of end-of-generation tokens that llama.cpp also stops on when the file marks them as control tokens.
EOG_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def gguf_tokenizer(gf: GgufFile, cfg: LlmConfig):
    """The file's vocabulary (``tokenizer.ggml.*``) as a ``hetero.llm.tokenizer.Tokenizer``."""
    from .tokenizer import Tokenizer, TokenizerPanic, guarded

    try:
        from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
        from tokenizers import Tokenizer as HfTokenizer
    except ImportError as exc:
        raise HeteroError("the 'tokenizers' package is needed for GGUF vocabularies",
                          hint="pip install tokenizers") from exc
    path = gf.path
    m = Fields(gf.metadata, gf.path, noun="metadata", arch=str(gf.metadata.get("general.architecture", "")))
    kind = m.str("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelFormatError(f"{path}: metadata 'tokenizer.ggml.model' = {kind!r}; hetero reads byte-level BPE "
                               "vocabularies ('gpt2')")
    tokens = gf.metadata.get("tokenizer.ggml.tokens")
    if gf.metadata_types.get("tokenizer.ggml.tokens") != gguf.ARRAY or not isinstance(tokens, list) or not tokens \
            or not isinstance(tokens[0], str):
        raise ModelFormatError(f"{path}: metadata 'tokenizer.ggml.tokens' must be a non-empty array of strings")
    merges = gf.metadata.get("tokenizer.ggml.merges", [])
    if not isinstance(merges, list) or (merges and not isinstance(merges[0], str)):
        raise ModelFormatError(f"{path}: metadata 'tokenizer.ggml.merges' must be an array of strings")
    n = len(tokens)
    types = gf.metadata.get("tokenizer.ggml.token_type")
    if types is None:
        types = np.full(n, TOKEN_NORMAL, dtype=np.int32)
    elif not isinstance(types, np.ndarray) or types.dtype.kind not in "iu" or types.shape != (n,):
        raise ModelFormatError(f"{path}: metadata 'tokenizer.ggml.token_type' must be {n} integers, one per token")
    vocab = dict(zip(reversed(tokens), range(n - 1, -1, -1), strict=True))  # a repeated token keeps its first id
    pairs = [tuple(m.split(" ")) for m in merges]
    bad = [i for i, p in enumerate(pairs) if len(p) != 2 or p[0] not in vocab or p[1] not in vocab
           or p[0] + p[1] not in vocab]
    if bad:
        skip = set(bad)
        pairs = [p for i, p in enumerate(pairs) if i not in skip]
    if bad:
        warnings.warn(f"hetero: {path.name}: {len(bad)} of the {len(merges)} entries of 'tokenizer.ggml.merges' "
                      f"(first: #{bad[0]} {merges[bad[0]]!r}) are not two tokens of the vocabulary that merge into "
                      "one; they are ignored", HeteroWarning, stacklevel=3)
    pre = m.str("tokenizer.ggml.pre")
    if pre is None:
        pre = "qwen2" if m.arch in ARCHITECTURES else "gpt-2"
        warnings.warn(f"hetero: {path.name} has no 'tokenizer.ggml.pre'; using the {pre!r} pre-tokenizer",
                      HeteroWarning, stacklevel=3)
    pattern = PRE_PATTERNS.get(PRE_ALIASES.get(pre, pre))
    if pattern is None:
        raise ModelFormatError(f"{path}: metadata 'tokenizer.ggml.pre' = {pre!r} is not a pre-tokenizer hetero "
                               f"knows", hint=f"known: {sorted(PRE_PATTERNS)}")
    try:
        tok = guarded(str(path), lambda: HfTokenizer(models.BPE(
            vocab, pairs, ignore_merges=pre in ("llama-bpe", "llama3", "llama-v3"), fuse_unk=False,
            byte_fallback=False)))
    except TokenizerPanic:
        raise
    except Exception as exc:  # tokenizers raises its own Exception type
        raise ModelFormatError(f"{path}: cannot build the BPE tokenizer from the file's vocabulary: {exc}") from None
    if pre in ("qwen2", "qwen35"):
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    control = np.flatnonzero(types == TOKEN_CONTROL).tolist()
    special = [AddedToken(tokens[i], special=True, normalized=False) for i in control]
    user = [AddedToken(tokens[i], special=False, normalized=False)
            for i in np.flatnonzero(types == TOKEN_USER_DEFINED).tolist()]
    tok.add_special_tokens(special)
    tok.add_tokens(user)
    bos = m.token_id("tokenizer.ggml.bos_token_id", n)
    eos_id = m.token_id("tokenizer.ggml.eos_token_id", n)
    add_bos = m.bool("tokenizer.ggml.add_bos_token", False)
    add_eos = m.bool("tokenizer.ggml.add_eos_token", False)
    if (add_bos and bos is not None) or (add_eos and eos_id is not None):
        head = f"{tokens[bos]}:0 " if add_bos and bos is not None else ""
        tail = f" {tokens[eos_id]}:0" if add_eos and eos_id is not None else ""
        used = {i for i, on in ((bos, add_bos), (eos_id, add_eos)) if on and i is not None}
        tok.post_processor = processors.TemplateProcessing(
            single=f"{head}$A:0{tail}", pair=f"{head}$A:0{tail} $B:1{tail}",
            special_tokens=[(tokens[i], i) for i in sorted(used)])
    eos = [i for i in cfg.eos_token_ids if i < n]
    eos += [i for i in control if tokens[i] in EOG_TEXTS]
    template = m.str("tokenizer.chat_template")
    return Tokenizer.from_parts(
        tok, chat_template=template, bos_token=tokens[bos] if bos is not None else None,
        eos_token=tokens[eos_id] if eos_id is not None else None, eos_ids=tuple(eos),
        config={"source": str(path)})


# -- open ----------------------------------------------------------------------------------------------------------
def open_gguf(path: Path, fmt: QuantFormat | None) -> ModelFiles:
    """A GGUF file's config, weights, tokenizer and sampling defaults, for ``hetero.llm.load``."""
    from .loader import ModelFiles

    gf = GgufFile(path)
    cfg = gguf_config(gf)
    tokenizer = gguf_tokenizer(gf, cfg) if "tokenizer.ggml.tokens" in gf.metadata else None
    label = cfg.raw.get("hetero.file_type") or cfg.torch_dtype
    # Backends that repack a weight read each of its pages once; dropping the pages while they build their kernels
    # keeps the file from being resident beside the copies (peak RSS ~ one copy of the model, not two).
    return ModelFiles(cfg, GgufWeights(gf, fmt), tokenizer, from_gguf(gf.metadata, path),
                      f"{cfg.family} {path.stem}", label, path, [path], releasing=gf.releasing)


__all__ = ["ARCHITECTURES", "GGML_BY_NAME", "GgufWeights", "gguf_config", "gguf_name", "gguf_tokenizer",
           "open_gguf"]
