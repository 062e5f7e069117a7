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


def moe_graph(tokens: int, spec: str, *, shared: bool = False, down_spec: str | None = None, seed: int = 0):
    """One hetero MoE node (6 experts, top 2, hidden 48 -- a partial 32-block --, inter 20) with weights in
    ``spec`` ("f32" or a hetero block format; ``down_spec``: down's own, named by the down_ attributes), float
    shared-expert weights if ``shared``, and its feeds."""
    from hetero.contract import TensorInfo, dtypes, quant
    from hetero.contract.graph import HETERO_DOMAIN, Graph, Node

    rng = np.random.default_rng(seed)
    experts, hidden, inter = 6, 48, 20
    fmt = None if spec == "f32" else quant.parse_quant(spec)
    down_fmt = fmt if down_spec is None else quant.parse_quant(down_spec)

    def stacked(n: int, k: int, fmt) -> np.ndarray:
        w = (rng.standard_normal((experts, n, k)) * 0.5).astype(np.float32)
        return w if fmt is None else np.stack([quant.quantize(e, fmt) for e in w])

    consts = {"router": rng.standard_normal((experts, hidden)).astype(np.float32),
              "gate": stacked(inter, hidden, fmt), "up": stacked(inter, hidden, fmt),
              "down": stacked(hidden, inter, down_fmt)}
    if shared:
        consts |= {"sg": rng.standard_normal((inter, hidden)).astype(np.float32),
                   "su": rng.standard_normal((inter, hidden)).astype(np.float32),
                   "sd": rng.standard_normal((hidden, inter)).astype(np.float32)}
    feeds = {"x": rng.standard_normal((tokens, hidden)).astype(np.float32)}
    graph = Graph(inputs=["x"], outputs=["y"], opsets={"": 21, HETERO_DOMAIN: 1}, name="moe")
    graph.values["x"] = TensorInfo(dtypes.float32, (None, hidden))
    for name, value in consts.items():
        graph.values[name] = TensorInfo(dtypes.from_numpy(value.dtype), value.shape)
    graph.initializers.update(consts)
    node_attrs = {**({"wtype": "f32"} if fmt is None else fmt.attrs()), "top_k": 2, "norm_topk_prob": 1}
    if down_spec is not None:
        assert down_fmt is not None
        node_attrs |= {f"down_{k}": v for k, v in down_fmt.attrs().items()}
    if shared:
        node_attrs |= {f"shared_{w}_wtype": "f32" for w in ("gate", "up", "down")}
    graph.nodes.append(Node("MoE", ["x", *consts], ["y"], node_attrs, name="moe", domain=HETERO_DOMAIN))
    return graph, feeds


@needs_emulator
@pytest.mark.parametrize("spec", ["f32", "q4", "q8_asym_b64"])
@pytest.mark.parametrize("tokens", [1, 5, 11])  # 11: the router's logits through the GEMM, not the matvec
def test_moe_routes_and_runs_the_experts_on_metal(emulated, spec, tokens):
    graph, feeds = moe_graph(tokens, spec)
    ours = hetero.Session(graph, backends=["metal"], on_fallback="error")
    ref = hetero.Session(moe_graph(tokens, spec)[0], backends=["reference"])
    assert {p.backend for p in ours.placement.nodes} == {"metal"}
    for _ in range(3):  # the third run is the replay of the bound plan
        np.testing.assert_allclose(ours.run(feeds)["y"], ref.run(feeds)["y"], rtol=1e-4, atol=1e-4)
    feeds = moe_graph(tokens, spec, seed=1)[1]  # other tokens: other experts through the same plan
    np.testing.assert_allclose(ours.run(feeds)["y"], ref.run(feeds)["y"], rtol=1e-4, atol=1e-4)


@needs_emulator
@pytest.mark.parametrize("case", ["shared", "own_down_type"])
def test_moe_nodes_metal_cannot_read_go_to_cpu(emulated, case):
    """A shared expert (inputs 5-8) or a per-tensor weight type: refused by the metal kernel, not ignored."""
    graph, feeds = moe_graph(3, "q4", shared=case == "shared", down_spec="q8" if case == "own_down_type" else None)
    ours = hetero.Session(graph, backends=["metal", "cpu"], on_fallback="silent")
    assert {p.backend for p in ours.placement.nodes} == {"cpu"}
    want = hetero.Session(graph, backends=["reference"]).run(feeds)["y"]
    # cpu multiplies quantized weights by int8-quantized activations: within 1 % of the float reference here
    np.testing.assert_allclose(ours.run(feeds)["y"], want, atol=0.01 * np.abs(want).max())


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
    assert {p.backend for p in llm.session.placement.nodes if p.op_type == "MoE"} <= {"metal"}
    ref = reference_logits(family)
    prompts = expected(family)["prompts"]
    for i, prompt in enumerate(prompts):
        llm.reset()
        logits = llm.prefill(prompt["ids"])
        assert np.abs(logits - ref[f"prompt{i}"]).max() < 1e-4
    greedy = load(FIXTURES / family, backends=["metal"], on_fallback="silent")
    prompt = prompts[0]
    assert greedy_tokens(greedy, prompt["ids"], len(prompt["greedy"])) == prompt["greedy"]


SPECULATIVE_FAMILIES = [
    "qwen3", *(pytest.param(f, marks=pytest.mark.slow) for f in ("qwen3_5", "qwen3_moe")),
]


@needs_emulator
@pytest.mark.parametrize("family", SPECULATIVE_FAMILIES)
def test_speculative_greedy_output_is_plain_decoding_on_metal(emulated, family):
    """The verify path on Metal's kernels: a block of drafted tokens scored in one pass over the cache, the rejected
    tail rolled back (for qwen3_5 the GatedDeltaRule state and conv history too), greedy tokens those of plain
    decoding on metal, with drafts accepted in full, in part and not at all."""
    pytest.importorskip("tokenizers")
    from llm.helpers import FIXTURES, load
    from llm.test_speculative import PROMPT, Scripted, _plain

    from hetero.llm.speculative import Lookahead, Speculation

    llm = load(FIXTURES / family, backends=["metal"], kv_cache="f16", on_fallback="silent")
    hot = {"Attention", "GatedDeltaRule", "MoE"}
    assert {p.backend for p in llm.session.placement.nodes if p.op_type in hot} == {"metal"}
    want = _plain(llm, PROMPT, 24)
    for drafter in (Scripted(want, len(PROMPT), max_draft=4), Lookahead(min_ngram=1)):
        llm.reset()
        llm.generate(PROMPT, 24, temperature=0, spec=Speculation(drafter, adaptive=False))
        assert list(llm.last.tokens) == want
        assert llm.stats.verify_steps > 0 and llm.stats.accepted_tokens < llm.stats.drafted_tokens
