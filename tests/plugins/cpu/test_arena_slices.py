"""Concat inputs computed in their slices of the Concat's output, Split outputs left as slices of their input
(``KernelProgram._slices``, the cpu backend's ``arena_slices``): a YOLOv8 C2f block's Split and Concat become
no-ops, and every result equals an interpreted run (no plan, so no slices) bit for bit, replayed at 1 and 2 threads.
Where a part would be unaligned, the batch is above one or a value feeds two Concats, the nodes copy as before."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model

pytest.importorskip("hetero_cpu._native", reason="the hetero-cpu native extension is not built")


def _silu(x: str, y: str) -> list:
    return [helper.make_node("Sigmoid", [x], [y + "_s"]), helper.make_node("Mul", [x, y + "_s"], [y])]


def _conv(name: str, x: str, y: str, k: int = 1) -> object:
    return helper.make_node("Conv", [x, name + "_w", name + "_b"], [y], name=name, pads=[k // 2] * 4)


def _c2f_model(c: int):
    """x [N, 4, H, W] -> 1x1 conv + SiLU (2c) -> Split (c, c) -> a 3x3 bottleneck with a residual Add -> one more
    3x3 conv -> Concat(a, b, m, u) -> 1x1 conv; beside it a Concat of three convs of 3, 5 and 2 channels (parts at
    odd channel offsets) and a Concat that reads the bottleneck's output again (a value in two Concats)."""
    rng = np.random.default_rng(c)
    f32 = np.float32
    nodes = [_conv("cv1", "x", "t0"), *_silu("t0", "t"),
             helper.make_node("Split", ["t", "halves"], ["a", "b"], name="split", axis=1),
             _conv("m1", "b", "m1_0", 3), *_silu("m1_0", "m1"), _conv("m2", "m1", "m2_0", 3),
             helper.make_node("Add", ["b", "m2_0"], ["m"], name="residual"),
             _conv("u", "m", "u", 3),
             helper.make_node("Concat", ["a", "b", "m", "u"], ["cat"], name="cat", axis=1),
             _conv("cv2", "cat", "y1"),
             _conv("p", "x", "p"), _conv("q", "x", "q", 3), _conv("r", "x", "r"),
             helper.make_node("Concat", ["p", "q", "r"], ["pqr"], name="pqr", axis=1),
             helper.make_node("Relu", ["pqr"], ["y2"]),
             helper.make_node("Relu", ["x"], ["xr"]),
             helper.make_node("Concat", ["m", "xr"], ["mx"], name="mx", axis=-3),
             helper.make_node("Neg", ["mx"], ["y3"])]
    shapes = {"cv1": (2 * c, 4, 1), "m1": (c, c, 3), "m2": (c, c, 3), "u": (c, c, 3), "cv2": (3, 4 * c, 1),
              "p": (3, 4, 1), "q": (5, 4, 3), "r": (2, 4, 1)}
    inits = [("halves", np.array([c, c], np.int64))]
    for name, (cout, cin, k) in shapes.items():
        inits += [(name + "_w", rng.normal(size=(cout, cin, k, k)).astype(f32) * 0.5),
                  (name + "_b", rng.normal(size=cout).astype(f32))]
    return make_model(nodes, [("x", TensorProto.FLOAT, ["N", 4, "H", "W"])],
                      [("y1", TensorProto.FLOAT, None), ("y2", TensorProto.FLOAT, None),
                       ("y3", TensorProto.FLOAT, None)], inits)


def _in_place(session) -> set[str]:
    program = session.programs[0]
    plan = program._current
    return {program.steps[i].node.name for i in plan.in_place}


@pytest.mark.parametrize(("c", "shape", "sliced"), [
    (3, (1, 4, 4, 4), {"split", "cat", "pqr"}),  # 64 bytes a channel: every part aligned
    (8, (1, 4, 20, 20), {"split", "cat", "pqr"}),  # YOLOv8n's 20 x 20 maps
    (5, (1, 4, 3, 3), set()),  # 36 bytes a channel: parts off the 64-byte alignment, copied
    (3, (2, 4, 4, 4), set()),  # two images: a part is not contiguous
])
def test_concat_and_split_in_place_equal_the_interpreter(threads, c, shape, sliced):
    model = _c2f_model(c)
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    session.run({"x": np.zeros(shape, np.float32)})
    session.run({"x": np.zeros(shape, np.float32)})  # planned and recorded
    assert _in_place(session) == sliced
    assert session.programs[0].replay is not None
    for seed in (1, 2, 3):
        feeds = {"x": np.random.default_rng(seed).normal(size=shape).astype(np.float32)}
        replayed = session.run(feeds)
        interpreted = hetero.Session(model, backends=["cpu"]).run(feeds)  # first run: no plan, every node copies
        for name in ("y1", "y2", "y3"):
            np.testing.assert_array_equal(replayed[name], interpreted[name], err_msg=name)
    # the sliced values are where the plan put them: the Concat's inputs one after another in its output
    program = session.programs[0]
    offsets = program.memory_plan.offsets
    if "cat" in sliced:
        at = offsets["cat"]
        for name in ("a", "b", "m", "u"):
            assert offsets[name] == at
            at += program.memory_plan.sizes[name]
        assert offsets["t"] == offsets["cat"]  # the Split's input, whose halves are the first two parts


def test_shape_change_after_planning_copies():
    """A second signature plans again; going back to the first replays its own plan (the Concat still a no-op)."""
    model = _c2f_model(3)
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    small, large = (1, 4, 4, 4), (1, 4, 8, 8)
    for shape in (small, small, large, large, small, large):
        feeds = {"x": np.random.default_rng(sum(shape)).normal(size=shape).astype(np.float32)}
        got = session.run(feeds)
        want = hetero.Session(model, backends=["cpu"]).run(feeds)
        for name in ("y1", "y2", "y3"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} {shape}")
