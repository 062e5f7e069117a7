"""The tiny Qwen fixtures' decoder on the HTP simulator as static-shape graphs (a prefill chunk of 8 tokens and a
one-token decode step, KV cache as graph inputs and outputs, no CPU fallback): in fp16 the same greedy tokens as
hetero's cpu backend (and transformers, whose tokens the fixture records); with q8 / q4 weights (hetero's block
formats, uint16 activations at the linear layers) within the measured logit error of the exact quantized model and of
cpu with the same quant."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetero.contract import UnsupportedOp
from hetero.contract.quant import dequantize, quantize
from hetero.llm.generate import greedy_tokens
from hetero.llm.loader import load
from hetero.llm.safetensors import SafetensorsModel

llm_graph = pytest.importorskip("hetero_hexagon.llm_graph")
from hetero_hexagon import llm_quant  # noqa: E402  (after the skip: the plugin may be absent)
from hetero_hexagon.llm_decoder import HtpDecoder  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llm"
# Measured on the qwen3 fixture (QNN 2.51 simulator, logits of magnitude <= 6.3), along cpu's greedy path:
# HTP q8 / q4 vs the exact quantized model (the float graph with hetero's dequantized weights on onnxruntime's CPU)
# 0.024 / 0.022; vs hetero's cpu with the same quant 0.21 / 0.22 (cpu's own integer activations differ by 0.21 / 0.24
# from the exact model); fp16 vs cpu float 0.056.
FP16_TOLERANCE = 0.15
EXACT_TOLERANCE = 0.06
CPU_TOLERANCE = 0.35


def float_weights(folder: Path) -> dict[str, np.ndarray]:
    model = SafetensorsModel(folder)
    assert all(e.dtype == "F32" for e in model.values())
    return {name: np.fromfile(e.path, np.float32, e.nbytes // 4, offset=e.begin).reshape(e.shape)
            for name, e in model.items()}


def test_greedy_tokens_on_the_htp_equal_cpu(hexagon):
    folder = FIXTURES / "qwen3"
    config = json.loads((folder / "config.json").read_text())
    expected = json.loads((folder / "expected.json").read_text())
    decoder = HtpDecoder(llm_graph.DecoderShape.from_config(config), float_weights(folder), chunk=8, context=64)
    cpu = load(folder, backends=["cpu"], all_logits=True, context=64)
    for prompt in expected["prompts"]:
        n = len(prompt["greedy"])
        on_cpu = greedy_tokens(cpu, prompt["ids"], n)
        assert on_cpu == prompt["greedy"]
        assert decoder.generate(prompt["ids"], n) == on_cpu
        path = prompt["ids"] + on_cpu[:-1]
        cpu.reset()
        assert np.abs(decoder.run(path, 0) - cpu.forward(path)).max() < FP16_TOLERANCE


def exact_quantized_logits(decoder: HtpDecoder, weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """The logits of ``ids`` from the float graph whose matrices hold hetero's dequantized weights, run by
    onnxruntime's CPU in the QNN worker: the quantized model without the HTP's fp16 and uint16 activations."""
    fmt = llm_quant.block_format(decoder.mode)
    exact = {k: dequantize(quantize(v, fmt), fmt, v.shape[1]).reshape(v.shape) if v.ndim == 2 else v
             for k, v in weights.items()}
    key, names = decoder.runtime.load_reference(
        llm_graph.decoder_graph(decoder.shape, exact, decoder.chunk, decoder.context), "the exact quantized model")
    cache, rows = llm_graph.KvCache(decoder.shape, decoder.context), []
    for start in range(0, len(ids), decoder.chunk):
        part = ids[start : start + decoder.chunk]
        out = dict(zip(names, decoder.runtime.run(key, cache.feeds(part, decoder.chunk), "reference"), strict=True))
        cache.append(out, len(part))
        rows.append(out["logits"][: len(part)])
    return np.concatenate(rows)


@pytest.mark.parametrize("mode", ["q8", "q4"])
def test_quantized_weights_on_the_htp(hexagon, mode):
    folder = FIXTURES / "qwen3"
    config = json.loads((folder / "config.json").read_text())
    weights = float_weights(folder)
    decoder = HtpDecoder(llm_graph.DecoderShape.from_config(config), weights, chunk=8, context=64, mode=mode)
    cpu = load(folder, backends=["cpu"], quant=mode, all_logits=True, context=64)
    for prompt in json.loads((folder / "expected.json").read_text())["prompts"]:
        n = len(prompt["greedy"])
        on_cpu = greedy_tokens(cpu, prompt["ids"], n)
        path = prompt["ids"] + on_cpu[:-1]  # cpu's greedy path: every step's logits, in one run
        cpu.reset()
        cpu_logits = cpu.forward(path)
        htp_logits = decoder.run(path, 0)
        assert np.abs(htp_logits - exact_quantized_logits(decoder, weights, path)).max() < EXACT_TOLERANCE
        assert np.abs(htp_logits - cpu_logits).max() < CPU_TOLERANCE
        on_htp = decoder.generate(prompt["ids"], n)
        # the same greedy tokens, up to a near tie of cpu's (q8's first prompt parts at its 9th token, where cpu's
        # two best logits are closer than the two backends' difference); q4 agrees on every prompt
        same = next((i for i, (a, b) in enumerate(zip(on_htp, on_cpu, strict=True)) if a != b), n)
        if same < n:
            best_two = np.sort(cpu_logits[len(prompt["ids"]) - 1 + same])[-2:]
            assert mode == "q8" and best_two[1] - best_two[0] < 2 * CPU_TOLERANCE


def test_block_weights_are_hetero_formats():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 64)).astype(np.float32)
    for mode in ("q8", "q4"):
        fmt = llm_quant.block_format(mode)
        q, scales = llm_quant.block_weight(w, mode)  # [K, N] and [K / 32, N]
        assert q.shape == (64, 6) and scales.shape == (2, 6)
        np.testing.assert_array_equal(q * np.repeat(scales, 32, axis=0), dequantize(quantize(w, fmt), fmt, 64).T)
        assert q.min() >= (-127 if mode == "q8" else -8) and q.max() <= (127 if mode == "q8" else 7)
    from onnx import numpy_helper

    values = rng.integers(-8, 8, (3, 5)).astype(np.int8)
    np.testing.assert_array_equal(numpy_helper.to_array(llm_quant.int4_tensor("w", values)), values)


def test_weight_modes_name_what_is_taken():
    assert [llm_quant.weight_mode(q) for q in (None, "q8", "q4_sym_b32")] == ["fp16", "q8", "q4"]
    for spec in ("q4_asym", "q8_b64"):
        with pytest.raises(UnsupportedOp, match="take q8 or q4"):
            llm_quant.weight_mode(spec)


@pytest.mark.parametrize(("family", "refusal"),
                         [("qwen2", "rope_type 'yarn'"), ("qwen3_moe", "model_type 'qwen3_moe'")])
def test_what_the_graphs_do_not_cover_is_named(family, refusal):
    config = json.loads((FIXTURES / family / "config.json").read_text())
    with pytest.raises(UnsupportedOp, match=refusal):
        llm_graph.DecoderShape.from_config(config)


def test_the_cache_mask_and_rope_tables():
    shape = llm_graph.DecoderShape(hidden=8, heads=2, kv_heads=1, head_dim=4, layers=1, vocab=10, eps=1e-6,
                                   rope_theta=10000.0)
    cache = llm_graph.KvCache(shape, context=6)
    cache.length = 2
    feeds = cache.feeds([5, 6, 7], tokens=4)  # three real tokens, one of padding
    visible = feeds["mask"] == 0
    # every query sees the two cached positions and the chunk up to itself; padding sees the real tokens only
    assert visible[:, :2].all() and not visible[:, 2:6].any()
    assert visible[:, 6:].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]
    np.testing.assert_allclose(feeds["cos"][0], np.cos(2 * np.array([1, 0.01, 1, 0.01])), rtol=1e-6)
    assert feeds["ids"].tolist() == [5, 6, 7, 0]
    with pytest.raises(ValueError, match="context of 6 positions is full"):
        cache.feeds([1] * 5, tokens=5)
