"""ONNX kernels' calls as one native call (``LlmStep.add_call``, ``hetero_cpu.fuse.step_calls``): a replayed model of
tiny nodes (openWakeWord's heads, its embedding net) runs its bound calls in one call instead of one Python call a
kernel. A prepared op is the call it replaces: it writes the same bits, reads its arrays' values when the step runs
(not when it was prepared: inputs change every run, a later op reads an earlier one's output), and an operand its
call would copy once (a strided conv input) is refused, the call kept apart. Against numpy references, at 1-3
threads and every ISA; a session whose replay is one step gives the outputs of the unmerged calls and onnxruntime's,
from several threads at once."""

from __future__ import annotations

import functools
import threading
import warnings

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

from hetero_cpu import fuse  # noqa: E402

from .conftest import thread_counts  # noqa: E402

threads = thread_counts(1, 2, 3)
mm = functools.partial


def _conv_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray, pads: tuple[int, int, int, int]) -> np.ndarray:
    """Stride-1 NCHW convolution in float64."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    kh, kw = w.shape[2:]
    ho, wo = xp.shape[2] - kh + 1, xp.shape[3] - kw + 1
    out = np.zeros((x.shape[0], w.shape[0], ho, wo))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + ho, j:j + wo], w[:, :, i, j])
    return out + b.reshape(1, -1, 1, 1)


def _program(r: np.random.Generator):
    """Bound calls of every preparable function, chained (each later op reads an earlier one's output), with the
    arrays they read and write, and a numpy reference of the outputs from the inputs."""
    f32 = np.float32
    a = {"x": r.standard_normal((3, 40)).astype(f32), "img": r.standard_normal((1, 8, 12, 10)).astype(f32),
         "seq": r.standard_normal((2, 5)).astype(f32), "padv": np.array(0.5, f32)}
    wg = r.standard_normal((40, 24)).astype(f32)
    bg = r.standard_normal(24).astype(f32)
    scale, shift = (r.standard_normal(24).astype(f32) for _ in range(2))
    wc = (0.3 * r.standard_normal((16, 8, 1, 3))).astype(f32)
    bc = r.standard_normal(16).astype(f32)
    mul, add = (r.standard_normal(16).astype(f32) for _ in range(2))
    o = {"g": np.zeros((3, 24), f32), "ln": np.zeros((3, 24), f32), "mean": np.zeros(3, f32),
         "invstd": np.zeros(3, f32), "act": np.zeros((3, 24), f32), "sum": np.zeros((3, 24), f32),
         "ge": np.zeros((3, 24), np.bool_), "conv": np.zeros((1, 16, 12, 10), f32),
         "pool": np.zeros((1, 16, 6, 5), f32), "aff": np.zeros((1, 16, 6, 5), f32),
         "pad": np.zeros((2, 9), f32), "col": np.zeros((5, 2), f32), "sm": np.zeros((3, 24), f32),
         "wh": np.zeros((3, 24), f32), "gat": np.zeros((2, 24), f32), "mm": np.zeros((1, 3, 5), f32),
         "cat": np.zeros((2, 9), f32), "gap": np.zeros((1, 16, 1, 1), f32)}
    idx = np.array([2, 0], np.int64)
    wm = r.standard_normal((1, 24, 5)).astype(f32)
    packed_b = _native.pack_b(wg, False, False, "high")
    packed_c = _native.prepack_conv(wc, 1, "high")
    program = [
        mm(_native.gemm_packed, a["x"], packed_b, o["g"], 1.0, 0.0, bg),
        mm(_native.layer_norm, o["g"], scale, shift, o["ln"], 1e-5, o["mean"], o["invstd"]),
        mm(_native.unary, "leaky_relu_min", o["ln"], o["act"], 0.2, -0.4),
        mm(_native.binary, "add", o["act"], np.broadcast_to(bg, (3, 24)), o["sum"]),
        mm(_native.compare, "ge", o["sum"], np.broadcast_to(np.float32(0.1), (3, 24)), o["ge"]),
        mm(_native.conv2d_packed, a["img"], packed_c, bc, o["conv"], [1, 1], [0, 1, 0, 1], [1, 1], "relu", 0.0,
           0.0),
        mm(_native.max_pool2d, o["conv"], o["pool"], [2, 2], [2, 2]),
        mm(_native.channel_affine, o["pool"], mul, add, o["aff"]),
        mm(_native.global_avg_pool, o["aff"], o["gap"]),
        mm(_native.pad, a["seq"], [0, 3], "constant", a["padv"], o["pad"]),
        mm(_native.copy, a["seq"].T, o["col"]),  # a strided source: copy reads it in place
        mm(_native.softmax, o["ln"], o["sm"], False),
        mm(_native.where, o["ge"], o["sum"], np.broadcast_to(np.float32(0), (3, 24)), o["wh"]),
        mm(_native.gather, o["sm"], idx, 0, o["gat"]),
        mm(_native.matmul, o["sm"].reshape(1, 3, 24), wm, o["mm"]),
        mm(_native.copy, a["seq"], o["cat"][:, 2:7]),  # a window of a larger output (a Concat's part)
    ]

    def reference() -> dict[str, np.ndarray]:
        g = a["x"].astype(np.float64) @ wg + bg
        mean = g.mean(1, keepdims=True)
        inv = 1 / np.sqrt(g.var(1, keepdims=True) + 1e-5)
        ln = (g - mean) * inv * scale + shift
        act = np.maximum(np.where(ln > 0, ln, 0.2 * ln), -0.4)
        conv = np.maximum(_conv_ref(a["img"], wc, bc, (0, 1, 0, 1)), 0)
        pool = conv.reshape(1, 16, 6, 2, 5, 2).max((3, 5))
        pad = np.full((2, 9), float(a["padv"]))
        pad[:, 3:8] = a["seq"]
        e = np.exp(ln - ln.max(1, keepdims=True))
        sm = e / e.sum(1, keepdims=True)
        cat = np.zeros((2, 9))
        cat[:, 2:7] = a["seq"]
        aff = pool * mul.reshape(1, -1, 1, 1) + add.reshape(1, -1, 1, 1)
        return {"g": g, "ln": ln, "mean": mean[:, 0], "invstd": inv[:, 0], "act": act, "sum": act + bg,
                "conv": conv, "pool": pool, "aff": aff,
                "pad": pad, "col": a["seq"].T, "sm": sm, "wh": np.where(act + bg >= 0.1, act + bg, 0),
                "gat": sm[idx], "mm": sm[None] @ wm, "cat": cat, "gap": aff.mean((2, 3), keepdims=True)}

    return program, a, o, reference


def test_a_step_of_onnx_calls_writes_what_its_calls_write(isa, threads):
    r = np.random.default_rng(7)
    program, ins, outs, reference = _program(r)
    merged = fuse.step_calls(program)
    assert len(merged) == 1 and isinstance(merged[0], _native.LlmStep) and len(merged[0]) == len(program)
    for trial in range(3):  # new values each run: the ops read them when the step runs, not when prepared
        for name, value in ins.items():
            value[...] = r.standard_normal(value.shape) if name != "padv" else trial - 1.5
        for call in program:
            call()
        want = {name: out.copy() for name, out in outs.items()}
        ref = reference()
        for name, value in ref.items():
            np.testing.assert_allclose(want[name], value, rtol=2e-4, atol=2e-4, err_msg=name)
        np.testing.assert_array_equal(want["ge"], ref["sum"] >= 0.1)
        for out in outs.values():
            out[...] = 0
        assert merged[0]() is True
        for name, out in outs.items():
            np.testing.assert_array_equal(out, want[name], err_msg=name)


def test_calls_a_step_cannot_prepare_stay_apart():
    r = np.random.default_rng(1)
    program, ins, outs, _ = _program(r)
    wide = np.zeros((1, 8, 12, 20), np.float32)
    strided = mm(_native.conv2d_packed, wide[..., ::2], program[5].args[1], *program[5].args[2:])  # copied once
    as_list = mm(_native.unary, "relu", outs["ln"].tolist(), outs["act"], 0.0, 0.0)  # a list: converted per call
    reduce = mm(_native.prelu, outs["ln"], outs["ln"], outs["act"])  # not a prepared function
    calls = [*program[:2], strided, *program[2:4], as_list, reduce, *program[4:]]
    merged = fuse.step_calls(calls)
    assert [len(c) if isinstance(c, _native.LlmStep) else c for c in merged] == \
        [2, strided, 2, as_list, reduce, len(program) - 4]
    step = _native.LlmStep()
    with pytest.raises(ValueError, match="strided operand"):
        step.add_call("conv2d_packed", strided.args)
    with pytest.raises(ValueError, match="must be a numpy array"):
        step.add_call("unary", as_list.args)
    with pytest.raises(ValueError, match="prelu cannot be prepared"):
        step.add_call("prelu", reduce.args)
    with pytest.raises(ValueError, match="strided operand"):  # gather's strided data: copied once by the call
        step.add_call("gather", (outs["sm"][:, ::2], np.array([0], np.int64), 0, np.zeros((1, 12), np.float32)))
    with pytest.raises(ValueError, match="strided operand"):  # a strided map: global_avg_pool copies it once
        step.add_call("global_avg_pool", (wide[..., ::2], np.zeros((1, 8, 1, 1), np.float32)))
    with pytest.raises(ValueError, match="global_avg_pool: out must have shape"):
        step.add_call("global_avg_pool", (outs["aff"], outs["pool"]))
    with pytest.raises(ValueError, match="gemm_packed: 2 arguments"):
        step.add_call("gemm_packed", program[0].args[:2])
    with pytest.raises(ValueError, match="out has shape"):  # the call's own check, at preparation
        step.add_call("gemm_packed", (ins["x"], program[0].args[1], outs["ln"][:2]))
    assert len(step) == 0
    assert {"conv2d_packed", "gemm_packed", "layer_norm", "max_pool2d", "global_avg_pool", "unary", "softmax",
            "where", "gather", "matmul", "reduce", "argreduce", "int_reduce", "one_hot"} <= set(_native.step_ops())


def test_gather_checks_its_indices_when_the_step_runs():
    """A replay's indices may come from the data: a prepared gather checks them at each run, before any write."""
    data, idx, out = np.arange(12, dtype=np.float32).reshape(4, 3), np.array([1, 3], np.int64), np.zeros((2, 3))
    out = out.astype(np.float32)
    step = _native.LlmStep()
    step.add_call("gather", (data, idx, 0, out))
    step.add_call("copy", (data[:2], out))
    assert step() is True
    idx[1] = 4
    out[...] = -1
    with pytest.raises(ValueError, match="index 4 is out of range"):
        step()
    np.testing.assert_array_equal(out, -1)


def _mlp_model():
    """Gemm, LayerNormalization, Relu, Gemm, Sigmoid (hey_jarvis's head in small) and a Conv / MaxPool /
    BatchNormalization branch: every kernel's call preparable."""
    from onnx import TensorProto, helper, numpy_helper

    r = np.random.default_rng(5)
    inits = {"w1": r.standard_normal((32, 48)), "b1": r.standard_normal(48), "s": r.standard_normal(48),
             "t": r.standard_normal(48), "w2": r.standard_normal((48, 4)), "b2": r.standard_normal(4),
             "wc": 0.3 * r.standard_normal((8, 2, 3, 1)), "bc": r.standard_normal(8),
             "bs": 1 + 0.1 * r.standard_normal(8), "bb": r.standard_normal(8), "bm": r.standard_normal(8),
             "bv": 1 + np.abs(r.standard_normal(8))}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "s", "t"], ["n"], axis=-1),
             helper.make_node("Relu", ["n"], ["a"]),
             helper.make_node("Gemm", ["a", "w2", "b2"], ["z"]),
             helper.make_node("Sigmoid", ["z"], ["y"]),
             helper.make_node("Conv", ["img", "wc", "bc"], ["c"], pads=[1, 0, 1, 0]),
             helper.make_node("Relu", ["c"], ["cr"]),
             helper.make_node("MaxPool", ["cr"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["p", "bs", "bb", "bm", "bv"], ["q"])]
    graph = helper.make_graph(
        nodes, "step", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32]),
                        helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 2, 10, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 8, 5, 4])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_replayed_model_is_one_step_with_the_unmerged_outputs(monkeypatch):
    import hetero

    ort = pytest.importorskip("onnxruntime")
    model = _mlp_model()
    r = np.random.default_rng(9)
    feeds = [{"x": r.standard_normal((2, 32)).astype(np.float32),
              "img": r.standard_normal((1, 2, 10, 8)).astype(np.float32)} for _ in range(4)]
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    def session():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return hetero.Session(model, backends=["cpu"], on_fallback="silent", options={"precision": "high"})

    merged = session()
    for f in feeds:
        merged.run(f)
    program = merged._fast.replay.program
    assert len(program) == 1 and isinstance(program[0], _native.LlmStep)
    monkeypatch.setenv("HETERO_CPU_STEP", "0")
    apart = session()
    for f in feeds:
        apart.run(f)
    assert not any(isinstance(c, _native.LlmStep) for c in apart._fast.replay.program)
    for f in feeds:
        got, want = merged.run(f), apart.run(f)
        for name, value in zip(("y", "q"), peer.run(["y", "q"], f), strict=True):
            np.testing.assert_array_equal(got[name], want[name])
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)
    # several threads on one session: each gets its own feed's outputs
    expected = [apart.run(f) for f in feeds]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(50):
                got = merged.run(feeds[i])
                for name in ("y", "q"):
                    np.testing.assert_array_equal(got[name], expected[i][name])
        except BaseException as e:  # reported below
            errors.append(e)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(len(feeds))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors[0]


def test_quantized_and_attention_ops_in_a_step_read_their_values_when_it_runs(isa, threads):
    """A T5-style chain, DynamicQuantizeLinear -> MatMulInteger(Scaled) -> attention, as one step: the activation's
    scale and zero point change at every run and the prepared qgemm_f32 reads them then; the same bits as the calls
    run one by one. Int8 A, or K not a multiple of 4 (copied at the call), stays apart."""
    r = np.random.default_rng(3)
    f32 = np.float32
    x = np.zeros((6, 64), f32)
    y, sc, zp = np.zeros((6, 64), np.uint8), np.zeros((), f32), np.zeros((), np.uint8)
    packed = _native.qpack_b(r.integers(-128, 128, (64, 48)).astype(np.int8), np.array(0, np.int8))
    wscale = r.uniform(1e-3, 1e-2, 48).astype(f32)
    bias = r.standard_normal(48).astype(f32)
    g = np.zeros((6, 48), f32)
    q, k, v = g.reshape(1, 6, 2, 24).transpose(0, 2, 1, 3), np.zeros((1, 2, 24, 6), f32), np.zeros((1, 2, 6, 24), f32)
    mask = np.broadcast_to(r.standard_normal((1, 1, 6, 6)).astype(f32), (1, 2, 6, 6))
    att = np.zeros((1, 2, 6, 24), f32)
    program = [
        mm(_native.dynamic_quantize, x, y, sc, zp),
        mm(_native.qgemm_f32, y, packed, zp, sc, bias, g, wscale),
        mm(_native.fused_attention, q, k, v, mask, att, 0.5, 1.0, False),
    ]
    merged = fuse.step_calls(program)
    assert len(merged) == 1 and len(merged[0]) == 3
    for trial in range(3):
        x[...] = r.standard_normal(x.shape) * (trial + 1) + trial
        k[...] = r.standard_normal(k.shape)
        v[...] = r.standard_normal(v.shape)
        for call in program:
            call()
        want = [a.copy() for a in (y, sc, zp, g, att)]
        for a in (y, sc, zp, g, att):
            a[...] = 0
        assert merged[0]() is True
        for got, w in zip((y, sc, zp, g, att), want, strict=True):
            np.testing.assert_array_equal(got, w)
    step = _native.LlmStep()
    with pytest.raises(ValueError, match="cannot be prepared"):
        step.add_call("qgemm_f32", (y.view(np.int8), packed, None, sc, bias, g, wscale))
    odd = _native.qpack_b(np.zeros((63, 48), np.int8), np.array(0, np.int8))
    with pytest.raises(ValueError, match="cannot be prepared"):
        step.add_call("qgemm_f32", (y[:, :63].copy(), odd, zp, sc, bias, g, wscale))
    assert len(step) == 0
