"""The tiny Qwen fixtures' decoder on the HTP simulator as static-shape graphs (a prefill chunk of 8 tokens and a
one-token decode step, KV cache as graph inputs and outputs, fp16, no CPU fallback): the same greedy tokens as
hetero's cpu backend (and transformers, whose tokens the fixture records)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetero.contract import UnsupportedOp
from hetero.llm.generate import greedy_tokens
from hetero.llm.loader import load
from hetero.llm.safetensors import SafetensorsModel

llm_graph = pytest.importorskip("hetero_hexagon.llm_graph")
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llm"


def float_weights(folder: Path) -> dict[str, np.ndarray]:
    model = SafetensorsModel(folder)
    assert all(e.dtype == "F32" for e in model.values())
    return {name: np.fromfile(e.path, np.float32, e.nbytes // 4, offset=e.begin).reshape(e.shape)
            for name, e in model.items()}


def test_greedy_tokens_on_the_htp_equal_cpu(hexagon):
    folder = FIXTURES / "qwen3"
    config = json.loads((folder / "config.json").read_text())
    expected = json.loads((folder / "expected.json").read_text())
    decoder = llm_graph.HtpDecoder(llm_graph.DecoderShape.from_config(config), float_weights(folder), chunk=8,
                                   context=64)
    cpu = load(folder, backends=["cpu"])
    for prompt in expected["prompts"]:
        n = len(prompt["greedy"])
        on_cpu = greedy_tokens(cpu, prompt["ids"], n)
        assert on_cpu == prompt["greedy"]
        assert decoder.generate(prompt["ids"], n) == on_cpu


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
