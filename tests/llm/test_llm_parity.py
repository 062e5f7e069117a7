"""hetero vs transformers on the tiny fixtures: logits of fixed prompts, greedy continuations, chat template.

Tolerances (max |logit difference|, logits span about ±7):
* float32 weights: 1e-4 (measured ~1e-5), and the same greedy tokens;
* float16 weights: 5e-2 (measured < 2e-2); bfloat16: 0.25 for the dense families (measured < 0.13) — for the MoE
  fixture bf16 rounding flips some top-2 routing choices, so only argmax agreement is checked there;
* q8 / q4: block quantization of these tiny random models moves logits by 0.2-0.4 (q8) and 3-8 (q4), so the check is
  exactness instead: a quantized load must equal a float model holding the dequantized weights (1e-4).
"""

from __future__ import annotations

import numpy as np
import pytest

from hetero.contract.quant import dequantize, parse_quant, quantize
from hetero.llm import safetensors
from hetero.llm.generate import greedy_tokens

from .helpers import FIXTURES, copy_model, expected, load, reference_logits


def max_logit_error(llm, family: str) -> tuple[float, float]:
    """(max abs error, fraction of positions whose argmax agrees) over the fixture prompts."""
    ref = reference_logits(family)
    errors, agree = [], []
    for i, prompt in enumerate(expected(family)["prompts"]):
        llm.reset()
        logits = llm.prefill(prompt["ids"])
        errors.append(float(np.abs(logits - ref[f"prompt{i}"]).max()))
        agree.extend(logits.argmax(-1) == ref[f"prompt{i}"].argmax(-1))
    return max(errors), float(np.mean(agree))


def test_float32_logits_match_transformers(family):
    error, agree = max_logit_error(load(FIXTURES / family, all_logits=True), family)
    assert error < 1e-4
    assert agree == 1.0


def test_float32_greedy_tokens_match_transformers(family):
    llm = load(FIXTURES / family)
    exp = expected(family)
    for prompt in exp["prompts"]:
        llm.reset()
        assert greedy_tokens(llm, prompt["ids"], len(prompt["greedy"])) == prompt["greedy"]
    chat = exp["chat"]
    assert greedy_tokens(llm, chat["ids"], len(chat["greedy"])) == chat["greedy"]
    last = llm.prefill(chat["ids"])
    assert np.abs(last[-1] - reference_logits(family)["chat_last"][0]).max() < 1e-4


def test_prefill_in_chunks_matches_one_shot(family):
    one = load(FIXTURES / family, all_logits=True, prefill_chunk=0)
    chunked = load(FIXTURES / family, all_logits=True, prefill_chunk=5)
    ids = expected(family)["prompts"][1]["ids"]
    full = one.prefill(ids)
    last = chunked.prefill(ids)
    assert chunked.stats.prefill_tokens == len(ids)
    np.testing.assert_allclose(last, full[-last.shape[0]:], atol=1e-5)


@pytest.mark.parametrize("dtype,tolerance", [("F16", 5e-2), ("BF16", 0.25)])
def test_half_precision_weights(family, dtype, tolerance, tmp_path):
    folder = copy_model(family, tmp_path, dtype)
    llm = load(folder, all_logits=True)
    wtypes = {n.attrs.get("wtype") for n in llm.session.graph.nodes if n.op_type == "QMatMul"}
    assert wtypes == {dtype.lower()}  # kept as stored (memory-mapped), not widened at load
    error, agree = max_logit_error(llm, family)
    if family == "qwen3_moe" and dtype == "BF16":
        assert agree >= 0.9  # routing flips: see the module docstring
    else:
        assert error < tolerance
        assert agree >= 0.9


def dequantized_copy(family: str, dest, spec: str):
    """A float32 copy of the fixture whose quantizable weights went through quantize -> dequantize."""
    fmt = parse_quant(spec)
    folder = copy_model(family, dest)
    st = safetensors.SafetensorsModel(folder)
    tensors = {}
    for name in st:
        w = st.float32(name)
        if w.ndim == 2 and not name.endswith("mlp.gate.weight"):  # the MoE router stays float
            w = dequantize(quantize(w, fmt), fmt, w.shape[1])
        tensors[name] = w
    (folder / "model.safetensors").unlink()
    safetensors.write(folder / "model.safetensors", tensors)
    return folder


@pytest.mark.parametrize("spec", ["q8", "q8_asym_b64", "q4", "q4_asym", "q4_b128", "q8_b128"])
def test_quantized_model_equals_its_dequantized_weights(family, spec, tmp_path):
    # The format's exactness, on the numpy reference; native kernels (int8 activations) are held to their own bounds
    # against it in tests/plugins/cpu/test_llm_kernels.py.
    quantized = load(copy_model(family, tmp_path / "q"), all_logits=True, quant=spec, backends=["reference"])
    reference = load(dequantized_copy(family, tmp_path / "dq", spec), all_logits=True, backends=["reference"])
    ids = expected(family)["prompts"][1]["ids"]
    np.testing.assert_allclose(quantized.prefill(ids), reference.prefill(ids), atol=1e-4)


def test_chat_template_matches_transformers(family):
    llm = load(FIXTURES / family)
    chat = expected(family)["chat"]
    assert llm.tokenizer.render_chat(chat["messages"]) == chat["rendered"]
    assert llm.tokenizer.render_chat(chat["messages"], enable_thinking=False) == chat["rendered_no_thinking"]
    assert llm.tokenize(chat["rendered"], add_special_tokens=False) == chat["ids"]


def test_tokenizer_matches_saved_ids(family):
    llm = load(FIXTURES / family)
    exp = expected(family)
    for prompt in exp["prompts"]:
        assert llm.tokenize(prompt["text"]) == prompt["ids"]
        assert llm.detokenize(prompt["ids"]) == prompt["text"]
    assert set(exp["eos_ids"]) <= set(llm.eos_ids)
