"""A GGUF file as an hetero LLM: the architecture metadata as an ``LlmConfig``, the tensors as a ``WeightSource``
under the Hugging Face names the families use, and the tokenizer and chat template from the file's own vocabulary.

Tensors are used as stored (memory-mapped, no conversion): F32 / F16 / BF16 as float weights, Q8_0 / Q4_0 / Q4_1 as
hetero's ``q8`` / ``q4`` block-32 formats (byte-identical), Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K as the GGUF wtypes of
``hetero.llm.quant``. llama.cpp's converter permutes nothing for the Qwen families (their rotary embedding is the
NeoX layout, as in Hugging Face), so the weights map one to one.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HeteroError, HeteroWarning, ModelFormatError
from . import gguf
from .config import LlmConfig, RopeConfig, _yarn_mscale
from .gguf import GGML_BY_NAME, GgufFile
from .quant import GGML_FORMATS, GgmlFormat, QuantFormat, bf16_to_f32, dequantize, quantize
from .weights import Weight, WeightSource

# general.architecture -> hetero family
ARCHITECTURES = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe"}

# GGUF tensor type -> (node attributes, the format to dequantize with); float types have no format.
_Q = {"Q8_0": QuantFormat(8, 32, True), "Q4_0": QuantFormat(4, 32, True), "Q4_1": QuantFormat(4, 32, False)}
_FORMATS: dict[str, QuantFormat | GgmlFormat] = {**_Q, **{f.ggml: f for f in GGML_FORMATS.values()}}
_FLOAT_WTYPE = {"F32": "f32", "F16": "f16", "BF16": "bf16"}

# general.file_type -> the name llama.cpp gives the mix (for labels only)
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
              12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
              32: "BF16"}

# Hugging Face name (as the family builders ask for it) -> GGUF name
_NAMES: list[tuple[re.Pattern[str], str]] = [(re.compile(p), r) for p, r in (
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
    for pattern, replacement in _NAMES:
        if pattern.match(hf_name):
            return pattern.sub(replacement, hf_name)
    return None


# -- config ----------------------------------------------------------------------------------------------------------
class _Meta:
    """Typed access to the GGUF metadata; every problem names the key and the file."""

    def __init__(self, gf: GgufFile, arch: str) -> None:
        self.gf, self.arch = gf, arch

    def key(self, name: str) -> str:
        return name.format(arch=self.arch)

    def fail(self, key: str, expected: str) -> ModelFormatError:
        got = self.gf.metadata.get(key, "<missing>")
        return ModelFormatError(f"{self.gf.path}: metadata {key!r} must be {expected}, got {got!r}")

    def int(self, name: str, default: int | None = None, *, minimum: int = 1) -> int:
        key = self.key(name)
        if key not in self.gf.metadata:
            if default is None:
                raise ModelFormatError(f"{self.gf.path}: required metadata {key!r} is missing")
            return default
        value = self.gf.metadata[key]
        if self.gf.metadata_types[key] not in gguf.INT_TYPES or value < minimum:
            raise self.fail(key, f"an integer >= {minimum}")
        return int(value)

    def float(self, name: str, default: float | None = None) -> float:
        key = self.key(name)
        if key not in self.gf.metadata:
            if default is None:
                raise ModelFormatError(f"{self.gf.path}: required metadata {key!r} is missing")
            return default
        value = self.gf.metadata[key]
        if self.gf.metadata_types[key] not in (*gguf.INT_TYPES, gguf.FLOAT32, gguf.FLOAT64) \
                or not math.isfinite(value):
            raise self.fail(key, "a finite number")
        return float(value)

    def bool(self, name: str, default: bool) -> bool:
        key = self.key(name)
        if key not in self.gf.metadata:
            return default
        if self.gf.metadata_types[key] != gguf.BOOL:
            raise self.fail(key, "a bool")
        return bool(self.gf.metadata[key])

    def str(self, name: str, default: str | None = None) -> str | None:
        key = self.key(name)
        if key not in self.gf.metadata:
            return default
        if self.gf.metadata_types[key] != gguf.STRING:
            raise self.fail(key, "a string")
        return self.gf.metadata[key]

    def token_id(self, name: str, vocab: int) -> int | None:
        key = self.key(name)
        if key not in self.gf.metadata:
            return None
        value = self.gf.metadata[key]
        if self.gf.metadata_types[key] not in gguf.INT_TYPES or not 0 <= value < vocab:
            raise self.fail(key, f"a token id in [0, {vocab})")
        return int(value)


def gguf_config(gf: GgufFile) -> LlmConfig:
    """``general.architecture`` and ``<arch>.*`` metadata -> LlmConfig (checked against the tensors)."""
    if gf.metadata_types.get("general.architecture") != gguf.STRING:
        raise ModelFormatError(f"{gf.path}: metadata 'general.architecture' is missing or not a string")
    arch = gf.metadata["general.architecture"]
    family = ARCHITECTURES.get(arch)
    if family is None:
        raise ModelFormatError(f"{gf.path}: general.architecture {arch!r} is not supported",
                               hint=f"hetero runs GGUF architectures {sorted(ARCHITECTURES)}")
    m = _Meta(gf, arch)
    hidden = m.int("{arch}.embedding_length")
    heads = m.int("{arch}.attention.head_count")
    kv_heads = m.int("{arch}.attention.head_count_kv", heads)
    if heads % kv_heads:
        raise m.fail(m.key("{arch}.attention.head_count_kv"), f"a divisor of the head count {heads}")
    if f"{arch}.attention.key_length" not in gf.metadata and hidden % heads:
        raise m.fail(m.key("{arch}.embedding_length"), f"a multiple of the head count {heads}")
    head_dim = m.int("{arch}.attention.key_length", hidden // heads)
    value_dim = m.int("{arch}.attention.value_length", head_dim)
    if value_dim != head_dim:
        raise m.fail(m.key("{arch}.attention.value_length"), f"equal to the key length {head_dim}")
    layers = m.int("{arch}.block_count")
    if layers > 4096:
        raise m.fail(m.key("{arch}.block_count"), "at most 4096")
    context = m.int("{arch}.context_length", 32768)
    embed = gf.tensors.get("token_embd.weight")
    if embed is None:
        raise ModelFormatError(f"{gf.path}: tensor 'token_embd.weight' is missing")
    if len(embed.dims) != 2 or embed.dims[0] != hidden:
        raise ModelFormatError(f"{gf.path}: tensor 'token_embd.weight' has dims {list(embed.dims)}; expected "
                               f"[{hidden}, vocab] ({arch}.embedding_length = {hidden})")
    vocab = embed.dims[1]
    moe = family == "qwen3_moe"
    experts = m.int("{arch}.expert_count") if moe else 0
    used = m.int("{arch}.expert_used_count") if moe else 0
    if moe and used > experts:
        raise m.fail(m.key("{arch}.expert_used_count"), f"at most the expert count {experts}")
    moe_inter = m.int("{arch}.expert_feed_forward_length") if moe else 0
    dense_layers = tuple(i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in gf) if moe else ()
    inter = m.int("{arch}.feed_forward_length", moe_inter if moe and not dense_layers else None)
    qkv_bias = family == "qwen2" or "blk.0.attn_q.bias" in gf
    eos = [i for i in (m.token_id("tokenizer.ggml.eos_token_id", vocab),
                       m.token_id("tokenizer.ggml.eot_token_id", vocab),
                       m.token_id("tokenizer.ggml.eom_token_id", vocab)) if i is not None]
    file_type = gf.metadata.get("general.file_type")
    raw = {k: v for k, v in gf.metadata.items() if not isinstance(v, (list, np.ndarray))}
    raw["hetero.file_type"] = FILE_TYPES.get(file_type, "") if isinstance(file_type, int) else ""
    return LlmConfig(
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


def _rope(m: _Meta, head_dim: int, context: int) -> RopeConfig:
    theta = m.float("{arch}.rope.freq_base", 10000.0)
    if theta <= 1:
        raise m.fail(m.key("{arch}.rope.freq_base"), "a number above 1")
    rotary = m.int("{arch}.rope.dimension_count", head_dim)
    if rotary > head_dim or rotary % 2:
        raise m.fail(m.key("{arch}.rope.dimension_count"), f"even and at most the head size {head_dim}")
    base = RopeConfig(theta=theta, rotary_dim=0 if rotary == head_dim else rotary)
    kind = m.str("{arch}.rope.scaling.type", "none")
    factor = m.float("{arch}.rope.scaling.factor", 0.0)
    if kind == "none" or (kind == "linear" and factor in (0.0, 1.0)):
        return base
    if factor <= 0:
        raise m.fail(m.key("{arch}.rope.scaling.factor"), f"a positive number for {kind} scaling")
    if kind == "linear":
        return RopeConfig(base.theta, base.rotary_dim, "linear", factor)
    if kind != "yarn":
        raise ModelFormatError(f"{m.gf.path}: metadata {m.key('{arch}.rope.scaling.type')!r} = {kind!r} is not "
                               "supported", hint="hetero knows none, linear and yarn")
    original = m.int("{arch}.rope.scaling.original_context_length", context)
    attention = m.float("{arch}.rope.scaling.attn_factor", 0.0) or _yarn_mscale(factor)
    return RopeConfig(base.theta, base.rotary_dim, "yarn", factor, original,
                      m.float("{arch}.rope.scaling.yarn_beta_fast", 32.0),
                      m.float("{arch}.rope.scaling.yarn_beta_slow", 1.0), True, attention)


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
        self.quant = quant  # type: ignore[assignment]

    def _name(self, hf_name: str) -> str:
        name = gguf_name(hf_name)
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
        mapped = gguf_name(name)
        return mapped is not None and mapped in self.gf

    def vector(self, name: str, n: int) -> np.ndarray:
        return self._float32(self._checked(name, (n,)))

    def matrix(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        return self._float32(self._checked(name, shape))

    def linear(self, name: str, rows: int, cols: int) -> Weight:
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
}
PRE_ALIASES = {"default": "gpt-2", "gpt2": "gpt-2", "llama3": "llama-bpe", "llama-v3": "llama-bpe"}
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
# Texts of end-of-generation tokens that llama.cpp also stops on when the file marks them as control tokens.
EOG_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def gguf_tokenizer(gf: GgufFile, cfg: LlmConfig):
    """The file's vocabulary (``tokenizer.ggml.*``) as a ``hetero.llm.tokenizer.Tokenizer``."""
    from .tokenizer import Tokenizer

    try:
        from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
        from tokenizers import Tokenizer as HfTokenizer
    except ImportError as exc:
        raise HeteroError("the 'tokenizers' package is needed for GGUF vocabularies",
                          hint="pip install tokenizers") from exc
    path = gf.path
    m = _Meta(gf, gf.metadata.get("general.architecture", ""))
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
        tok = HfTokenizer(models.BPE(vocab, pairs, ignore_merges=pre in ("llama-bpe", "llama3", "llama-v3"),
                                     fuse_unk=False, byte_fallback=False))
    except Exception as exc:  # tokenizers raises its own Exception type
        raise ModelFormatError(f"{path}: cannot build the BPE tokenizer from the file's vocabulary: {exc}") from None
    if pre == "qwen2":
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


# -- load ------------------------------------------------------------------------------------------------------------
def load_gguf(path: str | os.PathLike, backends: Sequence[str] | str | None = None, on_fallback: str = "warn",
              threads: int | None = None, quant: Any = None, context: int = 4096, *, prefill_chunk: int = 512,
              all_logits: bool = False, progress: bool | None = None):
    """A GGUF file -> ``Llm`` (see ``hetero.llm.load``)."""
    from .families import build_graph
    from .model import Llm
    from .quant import parse_quant

    file = Path(path)
    if not isinstance(context, int) or context < 1:
        raise HeteroError(f"context={context!r}; expected a positive number of tokens")
    gf = GgufFile(file)
    cfg = gguf_config(gf)
    fmt = parse_quant(quant)
    weights = GgufWeights(gf, fmt)
    graph = build_graph(cfg, weights, context=context, all_logits=all_logits, progress=bool(progress))
    tokenizer = gguf_tokenizer(gf, cfg) if "tokenizer.ggml.tokens" in gf.metadata else None
    label = cfg.raw.get("hetero.file_type") or cfg.torch_dtype
    if fmt is not None:
        label = f"{label}+{fmt.name}"
    return Llm(cfg, graph, tokenizer, context=context, backends=backends, on_fallback=on_fallback, threads=threads,
               prefill_chunk=prefill_chunk, name=f"{cfg.family} {file.stem}", quant=label, path=file)


__all__ = ["ARCHITECTURES", "GGML_BY_NAME", "GgufWeights", "gguf_config", "gguf_name", "gguf_tokenizer",
           "load_gguf"]
