"""Qwen3.5 / Qwen3.5-MoE / Qwen3-Next as GGUF files in llama.cpp's layout (architectures qwen35, qwen35moe,
qwen3next; written by scripts/make_gguf_fixtures.py with the transforms of llama.cpp's converter): the file holds
what llama.cpp expects (names, -exp(A_log), (1 + w) norms, tiled value heads), and hetero's load of it matches
transformers (float32: 1e-4, the tolerance of the Hugging Face load) with the same greedy tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hetero.llm.generate import greedy_tokens
from hetero.llm.gguf import GgufFile
from hetero.llm.gguf_model import gguf_config

from .helpers import FIXTURES, expected, load, reference_logits

ROOT = Path(__file__).resolve().parents[2]
HYBRID = {"qwen3_5": "qwen35", "qwen3_5_moe": "qwen35moe", "qwen3_5_next": "qwen3next"}
TOL = 1e-4


@pytest.fixture(autouse=True)
def _f32_kv_cache(monkeypatch):
    monkeypatch.setenv("HETERO_CPU_KV_CACHE", "f32")


@pytest.fixture(params=list(HYBRID))
def family(request) -> str:
    return request.param


def test_file_has_llama_cpp_layout(family, converted):
    from hetero.llm import safetensors

    gf = GgufFile(converted(family, "F32"))
    arch = HYBRID[family]
    assert gf.metadata["general.architecture"] == arch
    hf = safetensors.SafetensorsModel(FIXTURES / family)
    a_log = np.asarray(hf.float32("model.layers.0.linear_attn.A_log"))
    ssm_a = gf.array("blk.0.ssm_a")
    assert (ssm_a < 0).all() and "blk.0.ssm_dt.bias" in gf and "blk.0.post_attention_norm.weight" in gf
    assert gf["blk.0.ssm_conv1d.weight"].shape == (128, 4)  # squeezed [C, K]
    norm = np.asarray(hf.float32("model.norm.weight"))
    np.testing.assert_allclose(gf.array("output_norm.weight"), norm + 1, rtol=1e-6)  # (1 + w) stored
    np.testing.assert_array_equal(gf.array("blk.0.ssm_norm.weight"),
                                  np.asarray(hf.float32("model.layers.0.linear_attn.norm.weight")))
    if arch == "qwen3next":
        np.testing.assert_allclose(ssm_a, -np.exp(a_log), rtol=1e-6)
        assert {"blk.0.attn_qkv.weight", "blk.0.attn_gate.weight", "blk.0.ssm_ba.weight"} <= set(gf.tensors)
    else:  # 2 key heads, 4 value heads: stored tiled [k0 j0, k1 j0, k0 j1, k1 j1] = HF heads [0, 2, 1, 3]
        np.testing.assert_allclose(ssm_a, -np.exp(a_log[[0, 2, 1, 3]]), rtol=1e-6)
        z = np.asarray(hf.float32("model.layers.0.linear_attn.in_proj_z.weight")).reshape(4, 16, -1)
        np.testing.assert_array_equal(gf.array("blk.0.attn_gate.weight").reshape(4, 16, -1), z[[0, 2, 1, 3]])
    cfg = gguf_config(gf)
    assert cfg.norm_offset == 0.0 and cfg.linear_num_value_heads == 4 and cfg.linear_key_head_dim == 16
    assert cfg.layer_types == tuple(load(FIXTURES / family).config.layer_types)


def test_f32_logits_and_greedy_tokens_match_transformers(family, converted):
    path = converted(family, "F32")
    llm = load(path, all_logits=True)
    assert llm.config.family == load(FIXTURES / family).config.family
    ref = reference_logits(family)
    exp = expected(family)
    for i, prompt in enumerate(exp["prompts"]):
        llm.reset()
        assert np.abs(llm.prefill(prompt["ids"]) - ref[f"prompt{i}"]).max() < TOL
    for i, prompt in enumerate(exp["long_prompts"]):  # several 64-token chunks of the linear attention
        llm.reset()
        assert np.abs(llm.prefill(prompt["ids"])[prompt["rows"]] - ref[f"long{i}"]).max() < TOL
    greedy = load(path)
    for prompt in exp["prompts"]:
        greedy.reset()
        assert greedy_tokens(greedy, prompt["ids"], len(prompt["greedy"])) == prompt["greedy"]


def test_half_precision_file_stays_close_to_the_float_load(family, converted):
    ids = expected(family)["prompts"][1]["ids"]
    want = load(FIXTURES / family, all_logits=True).prefill(ids)
    got = load(converted(family, "F16"), all_logits=True).prefill(ids)
    assert np.abs(got - want).max() < 0.15


LINEAR_ATTN = [("in_proj_qkv", 128), ("in_proj_z", 64), ("in_proj_a", 4), ("in_proj_b", 4), ("out_proj", 64)]
NEXT_ATTN = [("in_proj_qkvz", 192), ("in_proj_ba", 8), ("out_proj", 64)]


def test_q8_0_weights_regroup_in_their_stored_type(family, converted):
    """The Q8_0 file's linear-attention matrices, as the family receives them (rows regrouped in the stored q8
    blocks; the tiled ssm_out, whose 16-wide value heads are narrower than a block, dequantized and regrouped),
    equal the F32 file's up to Q8_0 rounding. (Whole-model logits of these tiny random hybrids move by ~2 under
    any 8-bit quantization, the Hugging Face load with quant="q8" as much, so logits are not the check here.)"""
    from hetero.contract.quant import dequantize, format_from_attrs
    from hetero.llm.gguf_model import GgufWeights

    f32, q8 = (GgufWeights(GgufFile(converted(family, t))) for t in ("F32", "Q8_0"))
    for part, rows in NEXT_ATTN if family == "qwen3_5_next" else LINEAR_ATTN:
        name = f"model.layers.0.linear_attn.{part}.weight"
        want, got = f32.linear(name, rows, 64), q8.linear(name, rows, 64)
        if got.attrs["wtype"] == "f32":
            values = got.array
        else:
            fmt = format_from_attrs(got.attrs["wtype"], int(got.attrs.get("block_size", 32)),
                                    int(got.attrs.get("symmetric", 1)))
            values = dequantize(got.array, fmt, 64)
        scale = np.abs(want.array).max()
        assert np.abs(values - want.array).max() < scale / 100, part


def test_qwen35_pre_tokenizer_keeps_combining_marks_in_words():
    """llama.cpp's converter labels Qwen3.5's tokenizer ``tokenizer.ggml.pre = "qwen35"``: its split differs from
    qwen2's only in keeping combining marks (\\p{M}) inside words (NFC cannot compose every pair)."""
    from tokenizers import Regex, pre_tokenizers

    from hetero.llm.gguf_model import PRE_PATTERNS

    def split(pre: str, text: str) -> list[str]:
        tok = pre_tokenizers.Split(Regex(PRE_PATTERNS[pre]), behavior="isolated", invert=False)
        return [piece for piece, _ in tok.pre_tokenize_str(text)]

    text = "q\u0307x ok 12"  # q + combining dot above: no precomposed form
    assert split("qwen35", text) == ["q\u0307x", " ok", " ", "1", "2"]
    assert split("qwen2", text) == ["q", "\u0307x", " ok", " ", "1", "2"]
