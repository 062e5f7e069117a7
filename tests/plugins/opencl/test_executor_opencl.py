"""The core's executor on a device domain: arena planning in sub-buffers of one device allocation, shapes that
depend on values read from host copies (no waiting download), and a decode step replayed as bound native launches
(no per-kernel Python)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model
from hetero.llm.synthetic import load_synthetic

from .conftest import needs_device

pytestmark = needs_device
RNG = np.random.default_rng(11)


def _mlp():
    w1 = RNG.normal(size=(8, 16)).astype(np.float32)
    w2 = RNG.normal(size=(16, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["m"]), helper.make_node("Sigmoid", ["m"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, ["N", 8])], [("y", TensorProto.FLOAT, ["N", 4])],
                       [("w1", w1), ("w2", w2)])
    return model, lambda x: 1 / (1 + np.exp(-(np.maximum(x @ w1, 0) @ w2)))


def test_arena_on_the_device():
    model, expected = _mlp()
    session = hetero.Session(model, backends=["opencl"], on_fallback="error", optimize=False)
    (program,) = session.programs
    for batch in (5, 5, 3, 3, 3):  # 3 rows planned, recorded (its arena slices), then replayed
        x = RNG.normal(size=(batch, 8)).astype(np.float32)
        np.testing.assert_allclose(session.run({"x": x})["y"], expected(x), rtol=1e-4, atol=1e-5)
    plan = session.memory_plan
    assert plan is not None and set(plan.offsets) == {"h", "r", "m"}
    align = session.backends[0].arena_align
    assert all(offset % align == 0 for offset in plan.offsets.values())
    # every planned output is a sub-buffer of the one device allocation
    arena_outs = [t for step in program.steps for t in step.arena_outs or [] if t is not None]
    assert len(arena_outs) == 3 and all(t.buffer.capacity <= program._arena.capacity for t in arena_outs)
    assert program.replay is not None and program.replay.bound == 3  # the graph output's kernel runs dynamically


def test_value_dependent_shapes_come_from_host_copies(monkeypatch):
    """Shape -> Mul -> Reshape on opencl: the target shape is integer arithmetic on host copies, so no value is
    downloaded to decide a shape, while the input's shape changes from run to run."""
    from hetero_opencl.backend import OpenCLBackend

    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Mul", ["s", "k"], ["t"]),
             helper.make_node("Reshape", ["y", "t"], ["z"]),
             helper.make_node("Relu", ["z"], ["out"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, ["A", "B"]), ("y", TensorProto.FLOAT, ["C"])],
                       [("out", TensorProto.FLOAT, None)], [("k", np.array([2, 1], np.int64))])
    session = hetero.Session(model, backends=["opencl"], on_fallback="error", optimize=False)
    assert {p.backend for p in session.placement.nodes} == {"opencl"}
    waits: list[tuple[int, ...]] = []
    original = OpenCLBackend.download

    def counting(self, tensor):
        if tensor.host_copy is None:
            waits.append(tensor.shape)
        return original(self, tensor)

    monkeypatch.setattr(OpenCLBackend, "download", counting)
    for a, b in ((2, 3), (2, 3), (3, 2), (1, 4), (1, 4), (1, 4)):
        y = RNG.normal(size=(2 * a * b,)).astype(np.float32)
        out = session.run({"x": np.zeros((a, b), np.float32), "y": y})["out"]
        np.testing.assert_array_equal(out, np.maximum(y, 0).reshape(2 * a, b))
    assert waits == [(2 * a, b) for a, b in ((2, 3), (2, 3), (3, 2), (1, 4), (1, 4), (1, 4))]  # the outputs only


def _decode(llm, prompt, tokens):
    llm.reset()
    llm.prefill(prompt)
    return [llm.forward([t]).copy() for t in tokens]


def test_decode_step_replays_as_bound_native_launches():
    from hetero_opencl import _native

    def tiny():
        return load_synthetic("tiny", "q4", backends=["opencl"], on_fallback="error", context=64, progress=False)

    replayed, interpreted = tiny(), tiny()
    interpreted.session.programs[0].replayable = False
    prompt, tokens = [5, 17, 300, 2], [7, 7, 411, 3, 90, 12]
    got, want = _decode(replayed, prompt, tokens), _decode(interpreted, prompt, tokens)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    (program,) = replayed.session.programs
    replay = program.replay
    assert replay is not None and interpreted.session.programs[0].replay is None
    native = [c for c in replay.program if isinstance(c, functools.partial) and c.func.__name__ == "launch"
              and c.func.__self__.__class__ is _native.Context]
    # every kernel of the step is bound native launches, except the LM head writing the caller's fresh logits
    # (through the Slice of the last rows, a view: up to 16, a speculative verify step's; one in a decode step)
    others = [c for c in replay.program if c not in native]
    assert len(others) == 1 and others[0].args[1].kernel is program.steps[-1].kernel
    kernels = sum(1 for s in program.steps if not s.alias)
    assert replay.bound == kernels - 1 and len(native) >= replay.bound
    # a prefill (another shape) in between is interpreted, then decoding replays again, still equal
    for a, b in zip(_decode(replayed, [1, 2, 3], [4, 5, 6]), _decode(interpreted, [1, 2, 3], [4, 5, 6]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert program.replay is not None


def test_the_decode_profiler_leaves_the_guarded_kernels_working():
    """The profiler wraps each kernel's ``run`` whatever it is (the dtype guard's is its inner kernel's bound method,
    an instance attribute) and puts exactly that back: the step still computes what it did."""
    from hetero.llm.profile import profile_decode

    llm = load_synthetic("tiny", "q4", backends=["opencl"], on_fallback="silent", context=64, progress=False)
    prompt, tokens = [5, 17, 300, 2], [7, 411, 3]

    def decode():
        llm.reset()
        llm.prefill(prompt)
        return [llm.forward([t]).copy() for t in tokens]

    def runs():
        return [(getattr(k.run, "__func__", k.run), getattr(k.run, "__self__", None)) for _, k in llm.session.kernels()]

    before, methods = decode(), runs()
    result = profile_decode(llm, steps=4, prompt=4, warmup=2, rounds=2)
    ops = {op.op: op for op in result.ops}
    assert ops["QMatMul"].calls == 7 * llm.config.num_layers + 1
    assert runs() == methods  # each kernel's own run is back, not a wrapper and not the guard's class default
    for got, want in zip(decode(), before, strict=True):
        np.testing.assert_array_equal(got, want)


def test_buffers_and_kernels_outlive_their_context_object():
    """Python's garbage collector frees a session's cycle in any order: the native Context first, then its arena,
    sub-buffers, pooled buffers and kernels. Every object keeps the cl_context and its queue alive (the Context
    object's close only stops it), so these releases never reach a released context."""
    import gc

    from hetero_opencl import _native
    from hetero_opencl.factory import list_devices

    device = list_devices()[0]
    ctx = _native.Context(device.properties["platform_index"], device.properties["device_index"])
    arena = ctx.alloc(1 << 16)
    views = [ctx.sub(arena, offset, 4096) for offset in (0, 4096)]  # 4096: aligned for any device
    kernel = ctx.build("__kernel void fill(__global float* y) { y[get_global_id(0)] = 2.0f; }", "").kernel("fill")
    pooled = ctx.alloc(256)
    ctx.launch(kernel, [16], [], views[0])
    out = np.zeros(16, np.float32)
    ctx.read(views[0], out)
    np.testing.assert_array_equal(out, 2.0)
    del pooled  # back to the context's pool
    ctx.close()
    with pytest.raises(RuntimeError, match="closed"):
        ctx.alloc(16)
    del ctx
    gc.collect()
    del views, kernel, arena  # released after the context object: must not touch a released context
    gc.collect()
