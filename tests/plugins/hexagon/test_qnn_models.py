"""Models split between the HTP (QNN's simulator) and cpu, against onnxruntime: a CNN with ops the HTP does not take
in fp16 and in int8 QDQ, a real model of the suite (magika), and the context cache."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero
from hetero.contract import BackendError

ort = pytest.importorskip("onnxruntime", reason="onnxruntime (the oracle) is not installed")

# Worst |hexagon - onnxruntime| measured on QNN 2.51's simulator (soc 43), outputs of magnitude <= 1: fp16 CNN 2.6e-4
# (softmax) and 6.8e-4 (softsign), magika 1.8e-4; int8 QDQ CNN 2.0e-2. The bounds leave about 3x and 2.5x margin.
FP16_ATOL = 2e-3
INT8_ATOL = 5e-2


def cnn(tail_only: bool = False):
    """x[1,3,16,16] -> Conv+BN+Relu -> MaxPool -> Conv+HardSwish -> Erf -> Conv -> GAP -> Flatten -> Gemm ->
    Softsign -> Softmax. Erf and Softsign are ops QNN's HTP refuses. ``tail_only`` leaves out Erf and the final
    Softmax: the HTP takes one segment straight from the input and cpu the Softsign after it."""
    rng = np.random.default_rng(7)

    def w(*shape):
        return (rng.normal(size=shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    weights = {
        "w1": w(8, 3, 3, 3), "bn_s": rng.uniform(0.5, 1.5, 8).astype(np.float32),
        "bn_b": rng.normal(size=8).astype(np.float32) * 0.1, "bn_m": rng.normal(size=8).astype(np.float32) * 0.1,
        "bn_v": rng.uniform(0.5, 1.5, 8).astype(np.float32), "w2": w(16, 8, 3, 3), "b2": np.zeros(16, np.float32),
        "w3": w(16, 16, 1, 1), "fc": w(16, 10).T.copy().T, "fc_b": rng.normal(size=10).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["b1"], name="bn1"),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c2"], ["h2"], name="hswish2"),
        *([] if tail_only else [helper.make_node("Erf", ["h2"], ["e2"], name="erf")]),
        helper.make_node("Conv", ["h2" if tail_only else "e2", "w3"], ["c3"], name="conv3"),
        helper.make_node("GlobalAveragePool", ["c3"], ["g3"], name="gap"),
        helper.make_node("Flatten", ["g3"], ["f3"], name="flatten"),
        helper.make_node("Gemm", ["f3", "fc", "fc_b"], ["logits"], name="fc"),
        helper.make_node("Softsign", ["logits"], ["y" if tail_only else "s"], name="softsign"),
        *([] if tail_only else [helper.make_node("Softmax", ["s"], ["y"], name="softmax", axis=1)]),
    ]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def oracle(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def inputs(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(1, 3, 16, 16)).astype(np.float32)} for _ in range(n)]


def placement(session) -> dict[str, str]:
    """node name -> backend, from explain()'s table."""
    rows = {}
    for line in session.explain().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] not in ("backends:", "node", "nodes", "copies:"):
            rows[parts[0]] = parts[2]
    return rows


def test_cnn_split_between_htp_and_cpu_matches_onnxruntime(hexagon):
    model = cnn()
    session = hetero.Session(model, backends=["hexagon", "cpu"], on_fallback="silent")
    where = placement(session)
    assert where["erf"] == "cpu" and where["softsign"] == "cpu"
    assert {where[n] for n in ("conv1", "pool1", "conv2", "conv3", "gap", "flatten", "fc", "softmax")} == {"hexagon"}
    text = session.explain()
    assert "hexagon: Erf is not in the HTP op table" in text and "hexagon: Softsign is not in" in text
    for feeds in inputs(3):
        np.testing.assert_allclose(session.run(feeds)["y"], oracle(model, feeds), atol=FP16_ATOL)


def test_cnn_int8_qdq_with_a_calibration_set(hexagon):
    model = cnn(tail_only=True)
    calibration = inputs(8, seed=1)
    session = hetero.Session(model, backends=["hexagon", "cpu"], on_fallback="silent",
                             options={"hexagon_precision": "int8", "hexagon_calibration": calibration})
    assert placement(session)["conv1"] == "hexagon"
    for feeds in inputs(3, seed=2):
        np.testing.assert_allclose(session.run(feeds)["y"], oracle(model, feeds), atol=INT8_ATOL)


def test_int8_names_the_segment_inputs_it_cannot_calibrate(hexagon):
    # after Erf (on cpu) the next HTP segment reads "e2": the model's feeds cannot calibrate it
    with pytest.raises(BackendError, match=r"int8 calibration for segment 2 .* inputs \['e2'\]"):
        hetero.Session(cnn(), backends=["hexagon", "cpu"], on_fallback="silent",
                       options={"hexagon_precision": "int8", "hexagon_calibration": inputs(2)})


def test_compiled_contexts_are_cached_by_content(hexagon, tmp_path, monkeypatch):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    hetero.Session(cnn(tail_only=True), backends=["hexagon", "cpu"], on_fallback="silent")
    contexts = sorted(tmp_path.glob("hexagon/qnn/*/context.onnx"))
    assert len(contexts) == 1
    stamp = contexts[0].stat().st_mtime_ns
    hetero.Session(cnn(tail_only=True), backends=["hexagon", "cpu"], on_fallback="silent")
    assert contexts[0].stat().st_mtime_ns == stamp  # reused, not compiled again
    hetero.Session(cnn(tail_only=True), backends=["hexagon", "cpu"], on_fallback="silent",
                   options={"hexagon_soc_model": 57})
    assert len(list(tmp_path.glob("hexagon/qnn/*/context.onnx"))) == 2  # another SoC: another context


def test_magika_with_static_batch_on_the_htp(hexagon):
    """magika on the HTP but its second LayerNorm: there the sum of squares reaches 1.8e5, past fp16's 65504, and
    E[x^2] - E[x]^2 cancels (seen with everything on the HTP: "probabilities" of 64.8); hexagon_refuse keeps that
    block on cpu, as a user would after reading the intermediate values."""
    from tests.real_models.models import MODELS

    magika = MODELS["magika"]
    path = magika.file()
    if path is None:
        pytest.skip(magika.install_hint)
    import onnx

    model = onnx.load(str(path))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1  # NPUs compile static shapes
    feeds = magika.feeds(magika)
    layer_norm_1 = [n.name for n in model.graph.node if "/LayerNorm_1/" in n.name]
    session = hetero.Session(model, backends=["hexagon", "cpu"], on_fallback="silent",
                             options={"hexagon_refuse": layer_norm_1})
    where = placement(session)
    assert "LayerNorm_1/Sum_1 kept off the HTP by option hexagon_refuse" in session.explain()
    on_htp = [n for n, b in where.items() if b == "hexagon"]
    assert len(on_htp) >= len(where) // 2, session.explain()
    got = session.run(feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for out, expected in zip([o.name for o in model.graph.output], want, strict=True):
        np.testing.assert_allclose(got[out], expected, atol=FP16_ATOL)
