"""Hugging Face model folders -> GGUF files, written with the ``gguf`` package's writer (an independent tool).

Used two ways:

* by the tests (tests/llm/test_gguf*.py import this file): ``convert(folder, out, qtype)`` turns the tiny
  transformers-made fixtures of tests/fixtures/llm into GGUF files of any type, ``write_random_folder`` makes a
  Qwen3 folder whose matrices have rows of 256 (k-quants need them) from numpy alone;
* run as a script (``python scripts/make_gguf_fixtures.py``; needs ``gguf``, and torch + transformers for the
  reference logits) it writes the small committed files of tests/fixtures/gguf/:
  ``qwen3-q8_0.gguf`` (the qwen3 fixture in Q8_0) and ``qwen3k-q4_k_m.gguf`` (a 256-wide Qwen3 in a Q4_K_M-like
  mix of Q4_K / Q5_K / Q6_K / Q8_0) with ``qwen3k-q4_k_m.npz``: logits that transformers computes (eager
  attention) on the weights as the ``gguf`` package dequantizes them, and on the original float weights.

Quantization: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and BF16 by the ``gguf`` package's own numpy quantizers; the k-quants,
which it cannot make, by hetero's reference quantizer (its output is checked with the ``gguf`` package's
dequantizer). A matrix whose rows are not a whole number of the type's blocks falls back as llama.cpp does
(k-quants -> Q5_0 / Q8_0, then F16).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hetero.llm.gguf_model import HYBRID_NAMES, NAMES

ROOT = Path(__file__).resolve().parent.parent
LLM_FIXTURES = ROOT / "tests" / "fixtures" / "llm"
OUT = ROOT / "tests" / "fixtures" / "gguf"

ARCH = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe"}
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "q4_k_m": 15, "Q6_K": 18,
              "BF16": 32}
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q4_0": "F16", "Q4_1": "F16", "Q5_0": "F16",
            "Q5_1": "F16", "Q8_0": "F16"}


def gguf_tensor_name(hf: str) -> str:
    for pattern, repl in NAMES:  # the loader's own table (experts are stacked before this is asked)
        if pattern.match(hf):
            return pattern.sub(repl, hf)
    raise KeyError(f"no GGUF name for {hf!r}")


def read_hf(folder: Path) -> dict[str, np.ndarray]:
    """The folder's tensors as float32, the per-expert matrices stacked as ``blk.N.ffn_*_exps.weight``."""
    from hetero.llm import safetensors

    st = safetensors.SafetensorsModel(folder)
    tensors: dict[str, np.ndarray] = {}
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for name in st:
        value = np.array(st.float32(name), dtype=np.float32)
        match = _EXPERT.match(name)
        if match:
            experts.setdefault((int(match[1]), match[3]), {})[int(match[2])] = value
        else:
            tensors[gguf_tensor_name(name)] = value
    for (layer, proj), parts in experts.items():
        tensors[f"blk.{layer}.ffn_{proj}_exps.weight"] = np.stack([parts[e] for e in sorted(parts)])
    return tensors


def _write_tensors(w, tensors: dict[str, np.ndarray], pick) -> dict[str, str]:
    """Quantize each tensor to the type ``pick(name, value)`` asks for, write the file, close the writer; returns the
    type each tensor got (after llama.cpp-style fallbacks)."""
    import gguf

    types: dict[str, str] = {}
    for name, value in tensors.items():
        data, used = quantize(value, pick(name, value))
        types[name] = used
        if used in ("F32", "F16"):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[used])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types


def quantize(values: np.ndarray, qtype: str) -> tuple[np.ndarray, str]:
    """(stored array, type actually used) for a float32 array, with llama.cpp-style fallbacks."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    while True:
        if qtype == "F32":
            return values.astype(np.float32), qtype
        if qtype == "F16":
            return values.astype(np.float16), qtype
        gtype = GGMLQuantizationType[qtype]
        block = GGML_QUANT_SIZES[gtype][0]
        if values.shape[-1] % block == 0:
            break
        qtype = FALLBACK[qtype]
    if qtype in ("Q4_K", "Q5_K", "Q6_K"):
        from hetero.llm.quant import GGML_FORMATS
        from hetero.llm.quant import quantize as hetero_quantize

        fmt = GGML_FORMATS[qtype.lower()]
        return hetero_quantize(values, fmt), qtype
    return quants.quantize(values, gtype), qtype


def mostly(qtype: str) -> Callable[[str, np.ndarray], str]:
    """Every matrix in ``qtype``; 1-D tensors (norms, biases) and the MoE router in F32, as llama.cpp does."""

    def pick(name: str, value: np.ndarray) -> str:
        return "F32" if value.ndim < 2 or name.endswith("ffn_gate_inp.weight") else qtype

    return pick


def q4_k_m(name: str, value: np.ndarray) -> str:
    """A Q4_K_M-like mix: Q6_K for the output / embedding and half the v and down projections, Q5_K for k, Q4_K
    for the rest, Q8_0 where llama.cpp keeps more bits (here: the first layer's q)."""
    if value.ndim < 2 or name.endswith("ffn_gate_inp.weight"):
        return "F32"
    layer = re.match(r"^blk\.(\d+)\.", name)
    i = int(layer[1]) if layer else -1
    if name in ("output.weight", "token_embd.weight") or (name.endswith(("attn_v.weight", "ffn_down.weight",
                                                                         "ffn_down_exps.weight")) and i % 2 == 0):
        return "Q6_K"
    if name.endswith("attn_k.weight"):
        return "Q5_K"
    if i == 0 and name.endswith("attn_q.weight"):
        return "Q8_0"
    return "Q4_K"


def convert(folder: Path, out: Path, qtype: str | Callable[[str, np.ndarray], str] = "F32") -> dict[str, str]:
    """Write ``folder`` (a Hugging Face Qwen2/Qwen3/Qwen3-MoE folder) as the GGUF file ``out``; returns the type
    of each tensor."""
    import gguf

    config = json.loads((folder / "config.json").read_text())
    family = config["model_type"]
    if family in HYBRID_ARCH:
        return convert_hybrid(folder, out, qtype)
    arch = ARCH[family]
    tensors = read_hf(folder)
    pick = mostly(qtype) if isinstance(qtype, str) else qtype
    w = gguf.GGUFWriter(str(out), arch)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    w.add_uint32("general.file_type", FILE_TYPES.get(qtype if isinstance(qtype, str) else qtype.__name__, 0))
    w.add_string("general.name", folder.name)
    w.add_uint32(f"{arch}.block_count", config["num_hidden_layers"])
    w.add_uint32(f"{arch}.context_length", config.get("max_position_embeddings", 32768))
    w.add_uint32(f"{arch}.embedding_length", hidden)
    w.add_uint32(f"{arch}.feed_forward_length", config["intermediate_size"])
    w.add_uint32(f"{arch}.attention.head_count", heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", config.get("num_key_value_heads", heads))
    if family != "qwen2":
        w.add_uint32(f"{arch}.attention.key_length", head_dim)
        w.add_uint32(f"{arch}.attention.value_length", head_dim)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config.get("rms_norm_eps", 1e-6))
    rope = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    w.add_float32(f"{arch}.rope.freq_base", rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("linear", "yarn"):
        w.add_string(f"{arch}.rope.scaling.type", kind)
        w.add_float32(f"{arch}.rope.scaling.factor", rope["factor"])
        if kind == "yarn":
            w.add_uint32(f"{arch}.rope.scaling.original_context_length", rope["original_max_position_embeddings"])
    if family == "qwen3_moe":
        w.add_uint32(f"{arch}.expert_count", config.get("num_experts") or config["num_local_experts"])
        w.add_uint32(f"{arch}.expert_used_count", config["num_experts_per_tok"])
        w.add_uint32(f"{arch}.expert_feed_forward_length", config["moe_intermediate_size"])
    _tokenizer(w, folder, config)
    return _write_tensors(w, tensors, pick)


# -- Qwen3.5 / Qwen3.5-MoE / Qwen3-Next: the layout of llama.cpp's converter ------------------------------------------
HYBRID_ARCH = {"qwen3_5": "qwen35", "qwen3_5_text": "qwen35", "qwen3_5_moe": "qwen35moe",
               "qwen3_5_moe_text": "qwen35moe", "qwen3_next": "qwen3next"}
# Hugging Face -> GGUF tensor names of the hybrid architectures: the loader's own table (one source of truth).
_HYBRID_MAP = HYBRID_NAMES
# tensors llama.cpp keeps in float32 whatever the file type
_KEEP_F32 = ("ssm_conv1d.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_a", "ssm_dt.bias")


def _tiled(values: np.ndarray, axis: int, hk: int, r: int, size: int) -> np.ndarray:
    """Value heads from Hugging Face's grouped order (head k * r + j) to ggml's tiled order (j * hk + k)."""
    shape = list(values.shape)
    grid = values.reshape([*shape[:axis], hk, r, size, *shape[axis + 1:]])
    return np.swapaxes(grid, axis, axis + 1).reshape(shape)


def read_hybrid(folder: Path, config: dict) -> dict[str, np.ndarray]:
    """The folder's tensors under llama.cpp's names, transformed as its converter does (Qwen3NextModel and, for
    Qwen3.5, the value-head reorder): A -> -exp(A_log), dt_bias -> ssm_dt.bias, conv1d squeezed, every norm weight
    but the gated one + 1, Qwen3-Next's in_proj_qkvz split into attn_qkv (q | k | v, heads contiguous) and
    attn_gate, and for qwen35 / qwen35moe with more value than key heads the value heads tiled."""
    from hetero.llm import safetensors

    family = config["model_type"]
    hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    r = hv // hk
    reorder = HYBRID_ARCH[family] != "qwen3next" and hk != hv
    st = safetensors.SafetensorsModel(folder)
    tensors: dict[str, np.ndarray] = {}
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for hf in st:
        value = np.array(st.float32(hf), dtype=np.float32)
        name = hf.replace("model.language_model.", "model.")
        match = _EXPERT.match(name)
        if match:
            experts.setdefault((int(match[1]), match[3]), {})[int(match[2])] = value
            continue
        if name.endswith(".A_log"):
            value = -np.exp(value.astype(np.float64)).astype(np.float32)
        elif "conv1d" in name:
            value = value.reshape(value.shape[0], -1)
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            value = value + np.float32(1.0)
        if reorder and ".linear_attn." in name:
            qk = 2 * hk * dk
            if name.endswith("in_proj_qkv.weight") or "conv1d" in name:
                value = np.concatenate([value[:qk], _tiled(value[qk:], 0, hk, r, dv)])
            elif name.endswith("in_proj_z.weight"):
                value = _tiled(value, 0, hk, r, dv)
            elif name.endswith(("in_proj_a.weight", "in_proj_b.weight", ".A_log", ".dt_bias")):
                value = _tiled(value, 0, hk, r, 1)
            elif name.endswith("out_proj.weight"):
                value = _tiled(value, 1, hk, r, dv)
        if name.endswith("in_proj_qkvz.weight"):
            grid = value.reshape(hk, 2 * dk + 2 * r * dv, -1)
            q, k = grid[:, :dk], grid[:, dk:2 * dk]
            v, z = grid[:, 2 * dk:2 * dk + r * dv], grid[:, 2 * dk + r * dv:]
            flat = (lambda a: a.reshape(-1, a.shape[-1]))  # noqa: E731
            layer = re.match(r"^model\.layers\.(\d+)\.", name)[1]
            tensors[f"blk.{layer}.attn_qkv.weight"] = np.concatenate([flat(q), flat(k), flat(v)])
            tensors[f"blk.{layer}.attn_gate.weight"] = flat(z)
            continue
        for pattern, repl in _HYBRID_MAP:
            if pattern.match(name):
                tensors[pattern.sub(repl, name)] = value
                break
        else:
            tensors[gguf_tensor_name(name)] = value
    for (layer, proj), parts in experts.items():
        tensors[f"blk.{layer}.ffn_{proj}_exps.weight"] = np.stack([parts[e] for e in sorted(parts)])
    return tensors


def convert_hybrid(folder: Path, out: Path, qtype: str | Callable[[str, np.ndarray], str] = "F32") -> dict[str, str]:
    """Write a Qwen3.5 / Qwen3.5-MoE / Qwen3-Next folder as llama.cpp's converter would (architectures qwen35,
    qwen35moe, qwen3next); returns the type of each tensor."""
    import gguf

    raw = json.loads((folder / "config.json").read_text())
    config = {**raw, **(raw.get("text_config") or {})}
    family = config["model_type"]
    arch = HYBRID_ARCH[family]
    tensors = read_hybrid(folder, config)
    base = mostly(qtype) if isinstance(qtype, str) else qtype

    def pick(name: str, value: np.ndarray) -> str:
        return "F32" if name.endswith(_KEEP_F32) else base(name, value)

    w = gguf.GGUFWriter(str(out), arch)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    layers = config["num_hidden_layers"]
    w.add_uint32("general.file_type", FILE_TYPES.get(qtype if isinstance(qtype, str) else qtype.__name__, 0))
    w.add_string("general.name", folder.name)
    w.add_uint32(f"{arch}.block_count", layers)
    w.add_uint32(f"{arch}.context_length", config.get("max_position_embeddings", 32768))
    w.add_uint32(f"{arch}.embedding_length", hidden)
    if "intermediate_size" in config:
        w.add_uint32(f"{arch}.feed_forward_length", config["intermediate_size"])
    w.add_uint32(f"{arch}.attention.head_count", heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", config.get("num_key_value_heads", heads))
    w.add_uint32(f"{arch}.attention.key_length", head_dim)
    w.add_uint32(f"{arch}.attention.value_length", head_dim)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config.get("rms_norm_eps", 1e-6))
    rope = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    w.add_float32(f"{arch}.rope.freq_base", rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    partial = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25))
    w.add_uint32(f"{arch}.rope.dimension_count", int(head_dim * partial))
    if arch != "qwen3next":
        w.add_array(f"{arch}.rope.dimension_sections", rope.get("mrope_section", [11, 11, 10, 0]))
    w.add_uint32(f"{arch}.ssm.conv_kernel", config["linear_conv_kernel_dim"])
    w.add_uint32(f"{arch}.ssm.state_size", config["linear_key_head_dim"])
    w.add_uint32(f"{arch}.ssm.group_count", config["linear_num_key_heads"])
    w.add_uint32(f"{arch}.ssm.time_step_rank", config["linear_num_value_heads"])
    w.add_uint32(f"{arch}.ssm.inner_size", config["linear_value_head_dim"] * config["linear_num_value_heads"])
    types = config.get("layer_types") or []
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    interval = config.get("full_attention_interval") or (full[0] + 1 if full else 4)
    w.add_uint32(f"{arch}.full_attention_interval", interval)
    if arch != "qwen35":
        w.add_uint32(f"{arch}.expert_count", config["num_experts"])
        w.add_uint32(f"{arch}.expert_used_count", config["num_experts_per_tok"])
        w.add_uint32(f"{arch}.expert_feed_forward_length", config["moe_intermediate_size"])
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", config["shared_expert_intermediate_size"])
    _tokenizer(w, folder, config)
    return _write_tensors(w, tensors, pick)


def _tokenizer(w, folder: Path, config: dict) -> None:
    tok = json.loads((folder / "tokenizer.json").read_text())
    tcfg = json.loads((folder / "tokenizer_config.json").read_text())
    vocab: dict[str, int] = dict(tok["model"]["vocab"])
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for a in added.values():
        vocab[a["content"]] = a["id"]
    size = max(config["vocab_size"], max(vocab.values()) + 1)
    by_id = {i: t for t, i in vocab.items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(size)]
    types = []
    for i in range(size):
        if i in added:
            types.append(3 if added[i]["special"] else 4)  # CONTROL / USER_DEFINED
        else:
            types.append(1 if i in by_id else 5)  # NORMAL / UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    eos = tcfg.get("eos_token")
    if isinstance(eos, str) and eos in vocab:
        w.add_uint32("tokenizer.ggml.eos_token_id", vocab[eos])
    pad = tcfg.get("pad_token")
    if isinstance(pad, str) and pad in vocab:
        w.add_uint32("tokenizer.ggml.padding_token_id", vocab[pad])
    if isinstance(config.get("bos_token_id"), int):
        w.add_uint32("tokenizer.ggml.bos_token_id", config["bos_token_id"])
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    if tcfg.get("chat_template"):
        w.add_string("tokenizer.chat_template", tcfg["chat_template"])


# -- a 256-wide Qwen3 from numpy alone --------------------------------------------------------------------------------
KQ_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 256,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "tie_word_embeddings": False, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048,
    "attention_bias": False, "dtype": "float32", "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "silu",
    "vocab_size": 320,
}


KQ_MOE_CONFIG = {
    **KQ_CONFIG, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 256, "norm_topk_prob": True, "decoder_sparse_step": 1,
    "mlp_only_layers": [1], "tie_word_embeddings": True,
}


def write_random_folder(dest: Path, seed: int = 7, tokenizer_from: Path = LLM_FIXTURES / "qwen3",
                        tensors: dict[str, np.ndarray] | None = None, moe: bool = False) -> Path:
    """A Hugging Face Qwen3 (or, with ``moe``, Qwen3-MoE: layer 0 routed, layer 1 dense) folder with random
    float32 weights (rows of 256) and the qwen3 fixture's tokenizer; ``tensors`` replaces the random weights."""
    from hetero.llm import safetensors

    dest.mkdir(parents=True, exist_ok=True)
    cfg = KQ_MOE_CONFIG if moe else KQ_CONFIG
    if tensors is None:
        rng = np.random.default_rng(seed)
        h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
        nq, nkv, vocab = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]

        def mat(rows: int, cols: int) -> np.ndarray:
            return (rng.standard_normal((rows, cols)) * 1.5 / np.sqrt(cols)).astype(np.float32)

        def norm(n: int) -> np.ndarray:
            return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

        tensors = {"model.embed_tokens.weight": mat(vocab, h), "lm_head.weight": mat(vocab, h),
                   "model.norm.weight": norm(h)}
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            tensors.update({
                p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h),
                p + "self_attn.q_proj.weight": mat(nq * hd, h), p + "self_attn.k_proj.weight": mat(nkv * hd, h),
                p + "self_attn.v_proj.weight": mat(nkv * hd, h), p + "self_attn.o_proj.weight": mat(h, nq * hd),
                p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd),
            })
            if moe and i not in cfg["mlp_only_layers"]:
                tensors[p + "mlp.gate.weight"] = mat(cfg["num_experts"], h) * 4
                for e in range(cfg["num_experts"]):
                    q = f"{p}mlp.experts.{e}."
                    tensors.update({q + "gate_proj.weight": mat(inter, h), q + "up_proj.weight": mat(inter, h),
                                    q + "down_proj.weight": mat(h, inter)})
            else:
                tensors.update({p + "mlp.gate_proj.weight": mat(inter, h), p + "mlp.up_proj.weight": mat(inter, h),
                                p + "mlp.down_proj.weight": mat(h, inter)})
        if cfg["tie_word_embeddings"]:
            del tensors["lm_head.weight"]
    safetensors.write(dest / "model.safetensors",
                      {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}, {"format": "pt"})
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        src = tokenizer_from / name
        if src.is_file():
            (dest / name).write_bytes(src.read_bytes())
    return dest


def dequantized_folder(gguf_path: Path, dest: Path, like: Path) -> Path:
    """A copy of the Hugging Face folder ``like`` whose weights are the GGUF file's, dequantized by the ``gguf``
    package (the independent reference for what hetero must compute from the file)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from hetero.llm import safetensors

    reader = GGUFReader(str(gguf_path))
    stored = {t.name: dequantize(t.data, t.tensor_type).astype(np.float32) for t in reader.tensors}
    st = safetensors.SafetensorsModel(like)
    tensors = {}
    for name in st:
        match = _EXPERT.match(name)
        if match:
            value = stored[f"blk.{match[1]}.ffn_{match[3]}_exps.weight"][int(match[2])]
        else:
            value = stored[gguf_tensor_name(name)]
        tensors[name] = np.ascontiguousarray(value.reshape(st[name].shape), dtype=np.float32)
    dest.mkdir(parents=True, exist_ok=True)
    safetensors.write(dest / "model.safetensors", tensors, {"format": "pt"})
    for item in like.iterdir():
        if item.suffix == ".json" and item.name != "expected.json":
            (dest / item.name).write_bytes(item.read_bytes())
    return dest


PROMPT = "The quick brown fox jumps over the lazy dog. 1, 2, 3, 42!"


def transformers_logits(folder: Path, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy().astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from tokenizers import Tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    convert(LLM_FIXTURES / "qwen3", args.out / "qwen3-q8_0.gguf", "Q8_0")
    with tempfile.TemporaryDirectory() as tmp:
        src = write_random_folder(Path(tmp) / "qwen3k")
        out = args.out / "qwen3k-q4_k_m.gguf"
        types = convert(src, out, q4_k_m)
        ids = Tokenizer.from_file(str(src / "tokenizer.json")).encode(PROMPT).ids
        deq = dequantized_folder(out, Path(tmp) / "deq", src)
        np.savez_compressed(args.out / "qwen3k-q4_k_m.npz", ids=np.asarray(ids, dtype=np.int64),
                            dequantized=transformers_logits(deq, ids), original=transformers_logits(src, ids))
    print(f"wrote {args.out}: types {sorted(set(types.values()))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
