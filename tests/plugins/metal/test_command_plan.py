"""Command plans: a replayed segment's dispatches are recorded once and replayed (the emulator executes the same
``CommandPlan`` the GPU queue encodes into an indirect command buffer), the per-step values live in argument
buffers, and a replayed decode gives the tokens and logits of the interpreted run and of cpu."""

from __future__ import annotations

import numpy as np
import pytest

import hetero

from .conftest import needs_emulator

pytest.importorskip("hetero_metal")

from hetero_metal.command_plan import CONSTANT_ALIGNMENT, CommandPlan
from hetero_metal.emulator import EmulatorQueue
from hetero_metal.memory import PAGE, page_aligned
from hetero_metal.plan import ArgumentBuffer, dispatch

from .test_backend import emulated  # noqa: F401  # the fixture


def test_plan_packs_constants_aligned_and_binds_views_of_one_array_with_offsets():
    arena = np.zeros(64, np.float32)
    x, y = arena[:16], arena[32:48]
    first = dispatch("unary_f32", {"x": x, "y": y, "p": {"n": 16, "op": 0, "alpha": 0.0, "beta": 0.0}}, (1,), (16,))
    second = dispatch("unary_f32", {"x": y, "y": x, "p": {"n": 16, "op": 1, "alpha": 0.0, "beta": 0.0}}, (1,), (16,))
    plan = CommandPlan([[first], [second]])
    assert len(plan.buffers) == 2 and plan.buffers[1] is arena  # the constants, then the arena once
    (c0, c1) = plan.commands
    assert [b for b in c0.bindings if b[1] == 1] == [(0, 1, 0), (1, 1, 32 * 4)]
    assert [b for b in c1.bindings if b[1] == 1] == [(0, 1, 32 * 4), (1, 1, 0)]
    offsets = [b[2] for c in plan.commands for b in c.bindings if b[1] == 0]
    assert offsets == [0, CONSTANT_ALIGNMENT]
    assert plan.written == {1}


def test_views_of_backend_memory_bind_whole_pages():
    """The backend's memory is whole pages of its own, and a view of it binds that memory (by offset): what Metal
    wraps without a copy."""
    arena = page_aligned(1000)
    x = arena[128:192].view(np.float32)
    plan = CommandPlan([[dispatch("unary_f32", {"x": x, "y": x, "p": {"n": 16, "op": 0, "alpha": 0.0, "beta": 0.0}},
                                  (1,), (16,))]])
    root = plan.buffers[1]
    assert root.ctypes.data % PAGE == 0 and root.nbytes % PAGE == 0 and root.ctypes.data == arena.ctypes.data
    assert [b for b in plan.commands[0].bindings if b[1] == 1] == [(0, 1, 128), (1, 1, 128)]


def test_argument_buffer_checks_its_struct():
    args = ArgumentBuffer("rope", "p")
    args.write({"t": 1, "heads": 2, "dim": 8, "rotary_dim": 8, "past_len": 5})
    assert args.array.view(np.uint32).tolist() == [1, 2, 8, 8, 5]
    with pytest.raises(hetero.HeteroError, match="past_len"):
        args.write({"t": 1, "heads": 2, "dim": 8, "rotary_dim": 8})
    with pytest.raises(hetero.HeteroError, match="takes AttentionParams, not RopeParams"):
        dispatch("attention_f16kv", {"q": np.zeros(4, np.float32), "k_cache": np.zeros(4, np.float16),
                                     "v_cache": np.zeros(4, np.float16), "out": np.zeros(4, np.float32),
                                     "p": args}, (1,), (128,))


@needs_emulator
def test_queue_replays_a_bound_submission_with_the_argument_buffer_rewritten():
    queue = EmulatorQueue(seed=3)
    x = np.arange(-8, 8, dtype=np.float32)
    y = np.zeros_like(x)
    args = ArgumentBuffer("unary_f32", "p")
    bound = (dispatch("unary_f32", {"x": x, "y": y, "p": args}, (1,), (16,)),)
    for op, expected in ((1, np.maximum(x, 0)), (9, np.tanh(x)), (1, np.maximum(x, 0))):  # common.metal unary_op codes
        args.write({"n": 16, "op": op, "alpha": 0.0, "beta": 0.0})
        queue.commit(bound, bound=True)
        queue.wait()
        np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-7)
    assert (queue.recorded, queue.replayed) == (1, 2)


@needs_emulator
def test_queue_knows_which_host_memory_queued_work_writes():
    """A kernel reading a value on the host (past_len, token ids) waits only if queued work writes its memory."""
    queue = EmulatorQueue(seed=5)
    arena = np.zeros(64, np.float32)
    x, y, other = arena[:16], arena[16:32], arena[48:]
    queue.commit([dispatch("unary_f32", {"x": x, "y": y, "p": {"n": 16, "op": 1, "alpha": 0.0, "beta": 0.0}},
                           (1,), (16,))])
    assert queue.writes_pending(y) and queue.writes_pending(arena[20:21])
    assert not queue.writes_pending(x) and not queue.writes_pending(other)
    queue.wait()
    assert not queue.writes_pending(y)


def _metal_queue(session: hetero.Session):
    return next(b for b in session.backends if b.name == "metal").queue


@needs_emulator
def test_session_replay_records_once_and_records_again_for_a_new_shape(emulated):  # noqa: F811
    from onnx import TensorProto, helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Softmax", ["r"], ["s"], axis=-1), helper.make_node("Mul", ["s", "s"], ["y"])]
    w = np.random.default_rng(0).standard_normal((20, 33)).astype(np.float32)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 33])],
                              [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.reshape(-1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    session = hetero.Session(model, backends=["metal"], on_fallback="error")
    queue = _metal_queue(session)
    rng = np.random.default_rng(1)

    def check(rows: int) -> None:
        x = rng.standard_normal((rows, 20)).astype(np.float32)
        h = np.maximum(x.astype(np.float64) @ w, 0)
        e = np.exp(h - h.max(-1, keepdims=True))
        np.testing.assert_allclose(session.run({"x": x})["y"], (e / e.sum(-1, keepdims=True)) ** 2,
                                   rtol=1e-5, atol=1e-7)

    for _ in range(5):  # interpreted, recorded by the session, then replayed: plan recorded once, replayed twice
        check(5)
    assert (queue.recorded, queue.replayed) == (1, 2)
    for _ in range(4):  # another shape: a new replay binds new dispatches, so a new plan
        check(3)
    assert (queue.recorded, queue.replayed) == (2, 3)


@needs_emulator
def test_replayed_clip_reads_its_bounds_at_every_run(emulated):  # noqa: F811
    """Clip's bounds are graph inputs: the recorded plan replays with them rewritten into its argument buffer."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    scalar = [helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n in ("lo", "hi")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64]), *scalar],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])])
    session = hetero.Session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                             backends=["metal"], on_fallback="error")
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    for lo, hi in ((-1, 1), (-2, 0.5), (0.25, 2), (-0.5, 0.75), (1, 3)):
        y = session.run({"x": x, "lo": np.float32(lo), "hi": np.float32(hi)})["y"]
        np.testing.assert_array_equal(y, np.maximum(np.clip(x, lo, hi), 0))
    assert _metal_queue(session).replayed == 2


DECODE_STEPS = 6


def _decode(llm, before_replay=None) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens after the fixture's first prompt and every step's logits; ``before_replay`` is called once the
    session has interpreted and recorded the decode step (before the third, the first replayed)."""
    from llm.helpers import expected

    logits = llm.prefill(expected("qwen3")["prompts"][0]["ids"])
    tokens, steps = [], [logits[-1]]
    for i in range(DECODE_STEPS):
        if i == 2 and before_replay is not None:
            before_replay()
        tokens.append(int(np.argmax(logits[-1])))
        logits = llm.forward([tokens[-1]])
        steps.append(logits[-1])
    return tokens, steps


def _load(backends: list[str], replay: bool = True):
    pytest.importorskip("tokenizers")
    pytest.importorskip("jinja2")
    from llm.helpers import FIXTURES, load

    llm = load(FIXTURES / "qwen3", backends=backends, kv_cache="f16")
    if not replay:
        for program in llm.session.programs:
            if hasattr(program, "replayable"):
                program.replayable = False
    return llm


def _check_decode(llm, interpreted: tuple, cpu: tuple, before_replay=None) -> None:
    tokens, logits = _decode(llm, before_replay)
    assert tokens == interpreted[0] == cpu[0]
    np.testing.assert_allclose(np.stack(logits), np.stack(interpreted[1]), rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.stack(logits), np.stack(cpu[1]), rtol=0, atol=2e-3)


@pytest.fixture(scope="module")
def decode_references():
    """The interpreted metal decode (no replay) and cpu's, both over a half-precision KV cache."""
    import os

    from hetero_metal.factory import EMULATE_VARIABLE

    os.environ[EMULATE_VARIABLE] = "1"
    hetero.plugins.reload()
    try:
        if hetero.plugins.status("metal") is None:
            pytest.skip("hetero-metal is not installed as a distribution (pip install ./plugins/metal)")
        interpreted = _decode(_load(["metal"], replay=False))
        cpu = _decode(_load(["cpu"]))
    finally:
        del os.environ[EMULATE_VARIABLE]
        hetero.plugins.reload()
    return interpreted, cpu


@needs_emulator
def test_decode_replays_one_recorded_plan_per_step(emulated, decode_references):  # noqa: F811
    llm = _load(["metal"])
    queue = _metal_queue(llm.session)
    recorded = {}
    _check_decode(llm, *decode_references, before_replay=lambda: recorded.update(before=queue.recorded))
    # every node on metal: one segment. Prefill and decode steps 1-2 are interpreted / recorded by the session
    # (nothing bound: no plan); the first replayed step records the segment's plan, every later step replays it
    assert not llm.session.placement.fallbacks()
    assert recorded["before"] == 0 and queue.recorded == 1
    assert queue.replayed == DECODE_STEPS - 3
    kernels = {c.kernel for plan in queue.plans.values() for c in plan.commands}
    assert {"attention_f16kv", "kv_append", "rope", "embedding", "qmatvec", "rmsnorm_f32"} <= kernels


@needs_emulator
def test_a_replay_that_does_not_rewrite_the_argument_buffers_fails(emulated, decode_references,  # noqa: F811
                                                                   monkeypatch):
    """The decode check catches a plan replayed with stale per-step values (the recorded step's past_len and
    token id): the replayed steps skip the kernels' update()."""
    from hetero_metal.kernels import llm as llm_kernels

    def forget_updates() -> None:
        for cls in (llm_kernels.MetalEmbedding, llm_kernels.MetalRotary, llm_kernels.MetalAttention):
            monkeypatch.setattr(cls, "update", lambda self, inputs: True)

    with pytest.raises(AssertionError):
        _check_decode(_load(["metal"]), *decode_references, before_replay=forget_updates)
