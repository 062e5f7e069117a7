"""The backend as hetero sees it: unavailable off macOS unless the emulator is asked for, the conformance kit through
the emulator, and the tiny LLM fixtures (prefill logits against transformers, greedy tokens) with every op the
backend has a kernel for on metal."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import hetero
from hetero.contract import BackendUnavailable

from .conftest import needs_emulator

pytest.importorskip("hetero_metal")

from hetero_metal.factory import EMULATE_VARIABLE, MetalFactory


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS has Metal: the unavailable path is for other systems")
def test_off_macos_the_backend_is_unavailable_with_the_emulator_as_hint(monkeypatch):
    monkeypatch.delenv(EMULATE_VARIABLE, raising=False)
    with pytest.raises(BackendUnavailable) as caught:
        MetalFactory().probe()
    assert caught.value.message == "Metal needs macOS"
    assert EMULATE_VARIABLE in caught.value.hint
    hetero.plugins.reload()
    try:
        row = hetero.plugins.status("metal")
        if row is None:
            pytest.skip("hetero-metal is importable but not installed as a distribution (no entry point)")
        assert (row.status, row.reason) == ("unavailable", "Metal needs macOS")
    finally:
        hetero.plugins.reload()


@pytest.fixture
def emulated(monkeypatch):
    monkeypatch.setenv(EMULATE_VARIABLE, "1")
    monkeypatch.setenv("HETERO_METAL_EMULATE_SEED", "99")
    hetero.plugins.reload()
    if hetero.plugins.status("metal") is None:
        pytest.skip("hetero-metal is not installed as a distribution (pip install ./plugins/metal)")
    yield
    monkeypatch.delenv(EMULATE_VARIABLE)
    hetero.plugins.reload()


@needs_emulator
def test_emulated_device_is_probed(emulated):
    row = hetero.plugins.status("metal")
    assert row.status == "ok", row.reason
    assert [d.name for d in row.devices] == ["metal-emulator"]


@needs_emulator
def test_conformance_kit_through_the_emulator(emulated):
    from hetero.testing import conformance

    conformance.run(backend="metal")


@needs_emulator
def test_session_places_the_hot_path_on_metal(emulated):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    w = np.random.default_rng(0).standard_normal((20, 33)).astype(np.float32)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 33])],
                              [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.reshape(-1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    session = hetero.Session(model, backends=["metal"], on_fallback="error")
    x = np.random.default_rng(1).standard_normal((5, 20)).astype(np.float32)
    for _ in range(3):  # the third run is the replay, through the kernels' bind()
        y = session.run({"x": x})["y"]
        h = np.maximum(x.astype(np.float64) @ w, 0)
        e = np.exp(h - h.max(-1, keepdims=True))
        np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


LLM_FAMILIES = [
    "qwen3", *(pytest.param(f, marks=pytest.mark.slow) for f in ("qwen2", "qwen3_moe", "qwen3_5")),
]


@needs_emulator
@pytest.mark.parametrize("family", LLM_FAMILIES)
def test_llm_fixture_logits_and_greedy_tokens(emulated, family):
    pytest.importorskip("tokenizers")
    pytest.importorskip("jinja2")
    from llm.helpers import FIXTURES, expected, load, reference_logits

    from hetero.llm.generate import greedy_tokens

    llm = load(FIXTURES / family, backends=["metal"], on_fallback="silent", all_logits=True)
    gated = [p.backend for p in llm.session.placement.nodes if p.op_type == "GatedDeltaRule"]
    assert set(gated) <= {"metal"}  # Qwen3.5's linear-attention layers run in the Metal kernels
    ref = reference_logits(family)
    prompts = expected(family)["prompts"]
    for i, prompt in enumerate(prompts):
        llm.reset()
        logits = llm.prefill(prompt["ids"])
        assert np.abs(logits - ref[f"prompt{i}"]).max() < 1e-4
    greedy = load(FIXTURES / family, backends=["metal"], on_fallback="silent")
    prompt = prompts[0]
    assert greedy_tokens(greedy, prompt["ids"], len(prompt["greedy"])) == prompt["greedy"]


@needs_emulator
@pytest.mark.parametrize("family", ["qwen3", pytest.param("qwen3_5", marks=pytest.mark.slow)])
def test_speculative_greedy_output_is_plain_decoding_on_metal(emulated, family):
    """The verify path on Metal's kernels: a block of drafted tokens scored in one pass over the cache, the rejected
    tail rolled back (for qwen3_5 the GatedDeltaRule state and conv history too), greedy tokens those of plain
    decoding on metal, with drafts accepted in full, in part and not at all."""
    pytest.importorskip("tokenizers")
    from llm.helpers import FIXTURES, load
    from llm.test_speculative import PROMPT, Scripted, _plain

    from hetero.llm.speculative import Lookahead, Speculation

    llm = load(FIXTURES / family, backends=["metal"], kv_cache="f16", on_fallback="silent")
    placed = {p.op_type: p.backend for p in llm.session.placement.nodes}
    assert placed["Attention"] == "metal" and placed.get("GatedDeltaRule", "metal") == "metal"
    want = _plain(llm, PROMPT, 24)
    for drafter in (Scripted(want, len(PROMPT), max_draft=4), Lookahead(min_ngram=1)):
        llm.reset()
        llm.generate(PROMPT, 24, temperature=0, spec=Speculation(drafter, adaptive=False))
        assert list(llm.last.tokens) == want
        assert llm.stats.verify_steps > 0 and llm.stats.accepted_tokens < llm.stats.drafted_tokens
