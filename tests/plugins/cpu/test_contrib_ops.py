"""onnxruntime's contrib ops (domain com.microsoft) that onnxruntime-optimized files hold (issue 17): each op on small
random graphs with odd sizes, optional inputs present and absent, against onnxruntime itself, on hetero's numpy
reference and on the cpu backend (where ``lower_contrib_ops`` rewrites it into standard nodes and native kernels).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero
from tests import ort_int8

ort = pytest.importorskip("onnxruntime")

_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
          np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int8): TensorProto.INT8,
          np.dtype(np.uint8): TensorProto.UINT8}


def contrib_model(op_type: str, inputs: list[tuple[str, np.ndarray | None]], n_out: int, consts: tuple[str, ...] = (),
                  domain: str = "com.microsoft", **attrs: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """One com.microsoft node: inputs given as (name, value) (None: absent); names in ``consts`` become
    initializers, the rest graph inputs (returned as the feeds)."""
    names = [name if value is not None else "" for name, value in inputs]
    while names and not names[-1]:
        names.pop()
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op_type, names, outs, domain=domain, **attrs)
    feeds = {n: v for n, v in inputs if v is not None and n not in consts}
    graph = helper.make_graph(
        [node], op_type, [helper.make_tensor_value_info(n, _TYPES[v.dtype], list(v.shape)) for n, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [numpy_helper.from_array(v, n) for n, v in inputs if v is not None and n in consts])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    return model, feeds


def run_ort(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    model, feeds = ort_int8.exact(model, feeds)  # int8 weights as uint8 where onnxruntime's u8 x s8 saturates
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def check(model: Any, feeds: dict[str, np.ndarray], backend: str, atol: float = 1e-5, rtol: float = 1e-5,
          outputs: int | None = None, lowered: bool = True) -> None:
    want = run_ort(model, feeds)
    got = list(session(model, backend, lowered).run(feeds).values())
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if outputs is not None and i >= outputs:
            break
        assert g.shape == w.shape, (i, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"output {i}")


def session(model: Any, backend: str, lowered: bool = True) -> hetero.Session:
    """On "reference": the contrib node itself on its numpy reference (no passes, so no lowering); on "cpu": the
    default passes (lower_contrib_ops first) and native kernels, no fallback allowed where ``lowered`` (the form is
    one lower_contrib_ops rewrites: no contrib node may be left), else the node stays and runs on its reference."""
    if backend == "reference":
        return hetero.Session(model, backends=["reference"], on_fallback="error", optimize=False)
    pytest.importorskip("hetero_cpu._native", reason="the hetero-cpu native extension is not built")
    s = hetero.Session(model, backends=[backend], on_fallback="error" if lowered else "silent")
    left = [n.op_type for n in s.graph.nodes if n.domain == "com.microsoft"]
    assert bool(left) != lowered, f"contrib nodes left after the passes: {left}"
    if lowered:  # and no cpu node on a numpy kernel (Range: the key positions of a [B] lengths mask, a few int64s)
        slow = [s.graph.nodes[p.index].op_type for p in s.placement.nodes if p.implementation == "numpy"]
        assert set(slow) <= {"Range"}, slow
    return s


def rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


BACKENDS = ["reference", "cpu"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [dict(), dict(transA=1), dict(transB=1, alpha=0.125), dict(transA=1, transB=1),
                                  dict(batch_b=True), dict(const_b=True, transB=1, alpha=0.5)])
def test_fused_matmul(backend: str, case: dict) -> None:
    rng = np.random.default_rng(0)
    ta, tb = case.get("transA", 0), case.get("transB", 0)
    a = rand(rng, 2, 3, *((13, 7) if ta else (7, 13)))
    b_shape = (11, 13) if tb else (13, 11)
    b = rand(rng, *((2, 3, *b_shape) if case.get("batch_b") else b_shape))
    model, feeds = contrib_model("FusedMatMul", [("a", a), ("b", b)], 1, ("b",) if case.get("const_b") else (),
                                 transA=ta, transB=tb, alpha=case.get("alpha", 1.0))
    check(model, feeds, backend, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation,params,z", [("Relu", [], False), ("LeakyRelu", [0.2], False),
                                                 ("Clip", [0.0, 6.0], False), ("HardSigmoid", [0.3, 0.4], False),
                                                 ("Sigmoid", [], True), ("Tanh", [], False)])
def test_fused_conv(backend: str, activation: str, params: list[float], z: bool) -> None:
    rng = np.random.default_rng(1)
    x, w, b = rand(rng, 2, 5, 9, 11), rand(rng, 6, 5, 3, 3, scale=0.3), rand(rng, 6)
    inputs = [("x", x), ("w", w), ("b", b)] + ([("z", rand(rng, 2, 6, 5, 6))] if z else [])
    extra = {"activation_params": params} if params else {}
    model, feeds = contrib_model("FusedConv", inputs, 1, ("w", "b"), activation=activation, strides=[2, 2],
                                 pads=[1, 1, 1, 1], **extra)
    check(model, feeds, backend, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op_type,bias", [("Gelu", False), ("FastGelu", False), ("FastGelu", True),
                                          ("BiasGelu", True), ("QuickGelu", False)])
def test_gelu_family(backend: str, op_type: str, bias: bool) -> None:
    rng = np.random.default_rng(2)
    x = rand(rng, 2, 5, 37, scale=3.0)
    inputs = [("x", x)] + ([("bias", rand(rng, 37))] if bias else [])
    attrs = {"alpha": 1.5} if op_type == "QuickGelu" else {}
    model, feeds = contrib_model(op_type, inputs, 1, ("bias",), **attrs)
    check(model, feeds, backend, atol=2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bias_add(backend: str) -> None:
    """onnxruntime runs BiasAdd only on CUDA: against numpy."""
    rng = np.random.default_rng(3)
    x, bias, skip = rand(rng, 2, 3, 40), rand(rng, 40), rand(rng, 2, 3, 40)
    model, feeds = contrib_model("BiasAdd", [("x", x), ("bias", bias), ("skip", skip)], 1, ("bias",))
    (got,) = session(model, backend).run(feeds).values()
    np.testing.assert_allclose(got, x + bias + skip, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("beta,bias,n_out", [(True, True, 1), (False, False, 1), (True, False, 4), (True, True, 4),
                                             (False, True, 4)])
def test_skip_layer_normalization(backend: str, beta: bool, bias: bool, n_out: int) -> None:
    rng = np.random.default_rng(4)
    hidden = 37
    inputs = [("x", rand(rng, 2, 5, hidden)), ("skip", rand(rng, 2, 5, hidden)), ("gamma", rand(rng, hidden)),
              ("beta", rand(rng, hidden) if beta else None), ("bias", rand(rng, hidden) if bias else None)]
    model, feeds = contrib_model("SkipLayerNormalization", inputs, n_out, ("gamma", "beta", "bias"), epsilon=1e-5)
    check(model, feeds, backend, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bias,n_out", [(False, 1), (True, 1), (True, 4), (False, 4)])
def test_skip_simplified_layer_normalization(backend: str, bias: bool, n_out: int) -> None:
    rng = np.random.default_rng(5)
    hidden = 24
    inputs = [("x", rand(rng, 3, 1, hidden)), ("skip", rand(rng, 3, 1, hidden)), ("gamma", rand(rng, hidden)),
              ("bias", rand(rng, hidden) if bias else None)]
    model, feeds = contrib_model("SkipSimplifiedLayerNormalization", inputs, n_out, ("gamma", "bias"), epsilon=1e-6)
    # output 1 (the mean) is not written by onnxruntime's kernel: compare the others. Lowered (RMSNormalization)
    # only where the mean and inverse RMS outputs are not read.
    want = run_ort(model, feeds)
    got = list(session(model, backend, lowered=n_out == 1).run(feeds).values())
    for i in (0, 2, 3)[: max(1, n_out - 1)] if n_out > 1 else (0,):
        np.testing.assert_allclose(got[i], want[i], rtol=1e-5, atol=1e-5, err_msg=f"output {i}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,axis,n_out", [((2, 5, 24), -1, 1), ((3, 1, 7), -1, 2), ((2, 3, 4, 6), 2, 1)])
def test_simplified_layer_normalization(backend: str, shape: tuple[int, ...], axis: int, n_out: int) -> None:
    """onnxruntime's RMS norm, which its optimizer writes in the ONNX domain (T5's layer norms)."""
    rng = np.random.default_rng(14)
    inputs = [("x", rand(rng, *shape)), ("scale", rand(rng, *shape[axis:]))]
    model, feeds = contrib_model("SimplifiedLayerNormalization", inputs, n_out, ("scale",), domain="", axis=axis,
                                 epsilon=1e-6)
    left = n_out > 1  # the inverse RMS output read: not lowered
    want = run_ort(model, feeds)
    s = hetero.Session(model, backends=[backend], on_fallback="error" if not left else "silent",
                       optimize=backend != "reference")
    assert any(n.op_type == "SimplifiedLayerNormalization" for n in s.graph.nodes) == (left or backend == "reference")
    for g, w in zip(s.run(feeds).values(), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("segment,mask,positions,n_out", [(True, True, False, 2), (False, False, False, 2),
                                                         (True, False, True, 3), (False, True, False, 3)])
def test_embed_layer_normalization(backend: str, segment: bool, mask: bool, positions: bool, n_out: int) -> None:
    rng = np.random.default_rng(6)
    batch, seq, hidden, vocab = 2, 7, 20, 31
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    inputs = [("ids", ids), ("seg", rng.integers(0, 2, (batch, seq)).astype(np.int32) if segment else None),
              ("word", rand(rng, vocab, hidden)), ("pos", rand(rng, 16, hidden)),
              ("segemb", rand(rng, 2, hidden) if segment else None), ("gamma", rand(rng, hidden)),
              ("beta", rand(rng, hidden)),
              ("mask", np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32) if mask else None),
              ("posids", rng.integers(0, 16, (batch, seq)).astype(np.int32) if positions else None)]
    model, feeds = contrib_model("EmbedLayerNormalization", inputs, n_out, ("word", "pos", "segemb", "gamma", "beta"),
                                 epsilon=1e-12)
    # without a mask, a read mask_index (zeros) is left to the reference
    check(model, feeds, backend, atol=1e-5, lowered=mask or n_out < 2)


def _attention_case(rng: np.random.Generator, mask: str, batch: int = 2, seq: int = 5, hidden: int = 24,
                    heads: int = 3, past: int = 0, sizes: tuple[int, int, int] | None = None
                    ) -> tuple[list[tuple[str, np.ndarray | None]], int]:
    dq, dk, dv = sizes or (hidden, hidden, hidden)
    total = past + seq
    masks: dict[str, np.ndarray | None] = {
        "none": None,
        "lengths": np.array([seq, 3][:batch], np.int32) + past,
        "start_end": np.array([total, total - 1, 1, 2][: 2 * batch] if batch == 2 else [total, 1], np.int32),
        "2d": (rng.random((batch, total)) > 0.3).astype(np.int32),
        "3d": (rng.random((batch, seq, total)) > 0.3).astype(np.int32),
    }
    m = masks[mask]
    if m is not None and m.ndim >= 2:
        m[..., 0] = 1  # no fully masked row
    inputs = [("x", rand(rng, batch, seq, hidden)), ("w", rand(rng, hidden, dq + dk + dv, scale=0.3)),
              ("b", rand(rng, dq + dk + dv, scale=0.1)), ("mask", m),
              ("past", rand(rng, 2, batch, heads, past, dk // heads) if past else None)]
    return inputs, total


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask", ["none", "lengths", "start_end", "2d", "3d"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_masks(backend: str, mask: str, unidirectional: int) -> None:
    if mask == "start_end" and unidirectional:
        pytest.skip("a start position past a causal row masks it whole: float32 rounding of -10000 + score decides")
    rng = np.random.default_rng(7)
    inputs, _ = _attention_case(rng, mask)
    model, feeds = contrib_model("Attention", inputs, 1, ("w", "b"), num_heads=3, unidirectional=unidirectional)
    check(model, feeds, backend, atol=2e-5, lowered=not unidirectional and mask != "start_end")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [dict(batch=1, seq=1), dict(sizes=(24, 24, 12)), dict(past=3, mask="2d"),
                                  dict(past=2, unidirectional=1), dict(scale=0.3), dict(no_bias=True),
                                  dict(heads=4, hidden=20, seq=9, mask="lengths")])
def test_attention_forms(backend: str, case: dict) -> None:
    rng = np.random.default_rng(8)
    heads = case.get("heads", 3)
    inputs, _ = _attention_case(rng, case.get("mask", "none"), case.get("batch", 2), case.get("seq", 5),
                                case.get("hidden", 24), heads, case.get("past", 0), case.get("sizes"))
    if case.get("no_bias"):
        inputs[2] = ("b", None)
    attrs: dict[str, Any] = {"num_heads": heads, "unidirectional": case.get("unidirectional", 0)}
    if "sizes" in case:
        attrs["qkv_hidden_sizes"] = list(case["sizes"])
    if "scale" in case:
        attrs["scale"] = case["scale"]
    model, feeds = contrib_model("Attention", inputs, 2 if case.get("past") else 1, ("w", "b"), **attrs)
    check(model, feeds, backend, atol=2e-5, lowered=not case.get("past"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [dict(), dict(bias=True), dict(mask="2d"), dict(mask="lengths", bias=True),
                                  dict(attn_bias=True), dict(past=2, outputs=3), dict(kv_len=7, bias=True),
                                  dict(bnsh=True, kv_len=6), dict(kv_len=1, bias=True, mask="lengths")])
def test_multi_head_attention(backend: str, case: dict) -> None:
    rng = np.random.default_rng(9)
    batch, seq, hidden, heads = 2, 5, 24, 3
    kv_len = case.get("kv_len", seq)
    past = case.get("past", 0)
    total = kv_len + past
    masks = {"2d": (rng.random((batch, total)) > 0.3).astype(np.int32),
             "lengths": np.array([total, min(2, total)], np.int32)}
    mask = masks.get(case.get("mask", ""))
    if mask is not None and mask.ndim == 2:
        mask[:, 0] = 1
    k, v = rand(rng, batch, kv_len, hidden), rand(rng, batch, kv_len, hidden)
    if case.get("bnsh"):
        k = np.ascontiguousarray(k.reshape(batch, kv_len, heads, -1).transpose(0, 2, 1, 3))
        v = np.ascontiguousarray(v.reshape(batch, kv_len, heads, -1).transpose(0, 2, 1, 3))
    inputs = [("q", rand(rng, batch, seq, hidden)), ("k", k), ("v", v),
              ("bias", rand(rng, 3 * hidden, scale=0.1) if case.get("bias") else None), ("mask", mask),
              ("ab", rand(rng, batch, heads, seq, total) if case.get("attn_bias") else None),
              ("pk", rand(rng, batch, heads, past, hidden // heads) if past else None),
              ("pv", rand(rng, batch, heads, past, hidden // heads) if past else None)]
    model, feeds = contrib_model("MultiHeadAttention", inputs, case.get("outputs", 1), ("bias",), num_heads=heads)
    check(model, feeds, backend, atol=2e-5, lowered=not case.get("past") and not case.get("bnsh"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [dict(), dict(a_zp=True, b_zp=True), dict(per_column=True, b_zp=True, bias=True),
                                  dict(uint8_b=True, b_zp=True, a_zp=True, bias=True)])
def test_matmul_integer_to_float(backend: str, case: dict) -> None:
    rng = np.random.default_rng(10)
    k, n = 19, 13
    a = rng.integers(0, 255, (2, 3, k)).astype(np.uint8)
    b_type = np.uint8 if case.get("uint8_b") else np.int8
    lo, hi = (0, 255) if case.get("uint8_b") else (-128, 127)
    b = rng.integers(lo, hi, (k, n)).astype(b_type)
    scale_n = n if case.get("per_column") else 1
    inputs = [("a", a), ("b", b), ("a_scale", np.array(0.02, np.float32)),
              ("b_scale", (rng.random(scale_n) * 0.01 + 0.001).astype(np.float32).reshape(-1 if scale_n > 1 else ())),
              ("a_zp", np.array(128, np.uint8) if case.get("a_zp") else None),
              ("b_zp", rng.integers(lo, hi, scale_n).astype(b_type).reshape(-1 if scale_n > 1 else ())
               if case.get("b_zp") else None),
              ("bias", rand(rng, n) if case.get("bias") else None)]
    model, feeds = contrib_model("MatMulIntegerToFloat", inputs, 1, ("b", "b_scale", "b_zp", "bias"))
    check(model, feeds, backend, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [dict(), dict(b_zp=True, bias=True), dict(per_column=True, bias=True),
                                  dict(uint8_b=True, b_zp=True, rows=1)])
def test_dynamic_quantize_matmul(backend: str, case: dict) -> None:
    rng = np.random.default_rng(11)
    k, n = 21, 10
    a = rand(rng, case.get("rows", 4), 3, k)
    b_type = np.uint8 if case.get("uint8_b") else np.int8
    lo, hi = (0, 255) if case.get("uint8_b") else (-128, 127)
    scale_n = n if case.get("per_column") else 1
    inputs = [("a", a), ("b", rng.integers(lo, hi, (k, n)).astype(b_type)),
              ("b_scale", (rng.random(scale_n) * 0.01 + 0.001).astype(np.float32).reshape(-1 if scale_n > 1 else ())),
              ("b_zp", rng.integers(lo, hi, scale_n).astype(b_type).reshape(-1 if scale_n > 1 else ())
               if case.get("b_zp") else None),
              ("bias", rand(rng, n) if case.get("bias") else None)]
    model, feeds = contrib_model("DynamicQuantizeMatMul", inputs, 1, ("b", "b_scale", "b_zp", "bias"))
    check(model, feeds, backend, atol=1e-4)


def _ops_after_passes(model: Any) -> set[tuple[str, str]]:
    pytest.importorskip("hetero_cpu._native", reason="the hetero-cpu native extension is not built")
    return {(n.domain, n.op_type) for n in hetero.Session(model, backends=["cpu"], on_fallback="error").graph.nodes}


def test_lowered_nodes_meet_the_fusion_passes() -> None:
    """The standard nodes lower_contrib_ops writes are what the later passes fuse: an Attention with a length mask
    becomes MatMul + bias projections and one FusedAttention, a SkipLayerNormalization a LayerNormalization, a
    FusedConv with Relu hetero's FusedConv, a FusedMatMul by a constant transposed B a plain MatMul kernel."""
    rng = np.random.default_rng(12)
    inputs, _ = _attention_case(rng, "lengths")
    ops = _ops_after_passes(contrib_model("Attention", inputs, 1, ("w", "b"), num_heads=3)[0])
    assert ("hetero", "FusedAttention") in ops and ("", "Softmax") not in ops, ops
    hidden = 16
    skip = [("x", rand(rng, 1, 3, hidden)), ("skip", rand(rng, 1, 3, hidden)), ("gamma", rand(rng, hidden)),
            ("beta", rand(rng, hidden)), ("bias", rand(rng, hidden))]
    ops = _ops_after_passes(contrib_model("SkipLayerNormalization", skip, 1, ("gamma", "beta", "bias"))[0])
    assert ("", "LayerNormalization") in ops, ops
    conv = [("x", rand(rng, 1, 3, 8, 8)), ("w", rand(rng, 4, 3, 3, 3)), ("b", rand(rng, 4))]
    ops = _ops_after_passes(contrib_model("FusedConv", conv, 1, ("w", "b"), activation="Relu")[0])
    assert ops == {("hetero", "FusedConv")}, ops
    mm = [("a", rand(rng, 5, 7)), ("b", rand(rng, 3, 7))]
    ops = _ops_after_passes(contrib_model("FusedMatMul", mm, 1, ("b",), transB=1)[0])
    assert ops == {("", "MatMul")}, ops


def test_lowered_attention_and_quantized_matmuls_meet_their_fusions() -> None:
    """MultiHeadAttention (bias, [B, T] mask, attention_bias) becomes one FusedAttention; MatMulIntegerToFloat and
    DynamicQuantizeMatMul by a constant weight become the MatMulIntegerScaled of fuse_matmul_integer_scale."""
    rng = np.random.default_rng(13)
    batch, seq, hidden, heads = 2, 4, 12, 3
    mask = np.ones((batch, seq), np.int32)
    mask[1, 3] = 0
    mha = [("q", rand(rng, batch, seq, hidden)), ("k", rand(rng, batch, seq, hidden)),
           ("v", rand(rng, batch, seq, hidden)), ("bias", rand(rng, 3 * hidden)), ("mask", mask),
           ("ab", rand(rng, 1, heads, seq, seq))]
    ops = _ops_after_passes(contrib_model("MultiHeadAttention", mha, 1, ("bias",), num_heads=heads)[0])
    assert ("hetero", "FusedAttention") in ops and ("", "Softmax") not in ops, ops
    weights = rng.integers(-128, 127, (9, 5)).astype(np.int8)
    to_float = [("a", rng.integers(0, 255, (3, 9)).astype(np.uint8)), ("b", weights),
                ("a_scale", np.array(0.1, np.float32)), ("b_scale", np.array(0.2, np.float32)),
                ("a_zp", np.array(3, np.uint8)), ("b_zp", None), ("bias", rand(rng, 5))]
    # a_scale as in a real file: a constant (static quantization) or a DynamicQuantizeLinear's output
    ops = _ops_after_passes(contrib_model("MatMulIntegerToFloat", to_float, 1,
                                          ("b", "a_scale", "a_zp", "b_scale", "bias"))[0])
    assert ("hetero", "MatMulIntegerScaled") in ops and ("", "MatMulInteger") not in ops, ops
    dynamic = [("a", rand(rng, 3, 9)), ("b", weights), ("b_scale", np.array(0.2, np.float32))]
    ops = _ops_after_passes(contrib_model("DynamicQuantizeMatMul", dynamic, 1, ("b", "b_scale"))[0])
    assert ("hetero", "MatMulIntegerScaled") in ops and ("", "MatMulInteger") not in ops, ops


def test_attention_layers_share_one_mask_bias() -> None:
    """Two stacked Attention layers reading one [B] lengths mask (an optimized BERT's mask_index): one mask bias
    (one Where), both layers FusedAttention, and the output onnxruntime's."""
    rng = np.random.default_rng(15)
    batch, seq, hidden, heads = 2, 6, 12, 3
    x = rand(rng, batch, seq, hidden)
    lengths = np.array([6, 4], np.int32)
    weights = {f"{n}{i}": v for i in (0, 1) for n, v in (("w", rand(rng, hidden, 3 * hidden, scale=0.3)),
                                                         ("b", rand(rng, 3 * hidden, scale=0.1)))}
    nodes = [helper.make_node("Attention", [src, f"w{i}", f"b{i}", "mask"], [dst], domain="com.microsoft",
                              num_heads=heads) for i, (src, dst) in enumerate((("x", "h"), ("h", "y")))]
    graph = helper.make_graph(
        nodes, "two_layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
                              helper.make_tensor_value_info("mask", TensorProto.INT32, [batch])],
        [helper.make_empty_tensor_value_info("y")], [numpy_helper.from_array(v, k) for k, v in weights.items()])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    feeds = {"x": x, "mask": lengths}
    s = session(model, "cpu")
    ops = [n.op_type for n in s.graph.nodes]
    assert ops.count("FusedAttention") == 2 and ops.count("Where") == 1, ops
    np.testing.assert_allclose(s.run(feeds)["y"], run_ort(model, feeds)[0], rtol=1e-5, atol=2e-5)
