"""Fusing a replay's bound calls (``CpuBackend.fuse_calls``): fewer parallel regions and calls per decode step.

A replayed step is a flat list of zero-argument calls, most of them ``functools.partial`` of a native function with
its buffers (``CpuKernel.bind``). Three patterns of consecutive calls become one native call each:

* matmuls of one input (q / k / v projections): ``llm_matmul`` x n -> ``llm_matmul_multi``;
* gate and up of one input, then SwiGLU of their outputs: -> ``llm_matmul_swiglu``;
* a matmul, then the residual ``Add`` of its output: -> ``llm_matmul_residual``.

Then every run of consecutive calls that native code can take whole (the matmuls above and fused, ``rms_norm``,
SwiGLU, the rotary embedding and the attention of a one-sequence step, both reading ``past_len`` from the replay's
int64 buffer when they run, and the one-row attention of a model of several sequences, reading its slot too)
becomes one ``LlmStep`` call (``step_calls``): the ops run in order with the GIL released once, so a Qwen decode
step is a handful of Python calls instead of ~300. Each op is the call it replaces, prepared once; the rotary and
attention range checks run natively before any op, and if one refuses, the step runs the original calls instead (so
the error is the original one). ``HETERO_CPU_STEP=0`` keeps the calls apart.

ONNX kernels' calls join steps too (``_native.step_ops()``: GEMM, convolution, max pool, layer norm, elementwise,
compare, channel affine, pad, copy; ``LlmStep.add_call``): the native entry point's checks run once, when the step is
made, and the op reads its arrays' values when it runs, so a replayed model of tiny nodes (openWakeWord's heads, 9
calls) is one Python call. An operand the entry point would copy at each call (a strided conv input, a strided bias)
is refused and its call stays apart (``tests/plugins/cpu/test_step_onnx.py``).

A fused call writes every buffer the calls it replaces write (the matmuls' outputs too, so a later reader of them
is unaffected) with the same kernels on the same values, and the calls were consecutive, so nothing ran between
them: the result is the unfused one (``tests/plugins/cpu/test_fuse.py``). A pattern is taken only when its buffers
cannot overlap where the order of the original calls would matter (outputs against each other and against the
inputs they are computed from). A fused output may overlap the matmuls' input x (the arena reuses x's memory once
its last reader, up_proj or o_proj, is done): the fused kernels quantize x into their own buffer before any task
writes, and their fallback (several rows, float weights) runs the original calls in order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _native
from .kernels.llm import AttentionCall, SlotAttentionCall

Call = Callable[[], Any]


def _args(call: Call, func: Any, n: int) -> tuple | None:
    """The positional arguments of ``call`` if it is ``partial(func, <n args>)``."""
    if isinstance(call, functools.partial) and call.func is func and not call.keywords and len(call.args) == n:
        return call.args
    return None


def _same(a: Any, b: Any) -> bool:
    """The same memory viewed the same way (the replay may hand two kernels distinct views of one buffer)."""
    if a is b:
        return True
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype
            and a.strides == b.strides and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _apart(*arrays: Any) -> bool:
    """No two of the arrays may share memory."""
    live = [a for a in arrays if a is not None]
    return not any(np.may_share_memory(live[i], live[j]) for i in range(len(live)) for j in range(i + 1, len(live)))


# Activation rows a fused matmul takes: a decode step's one, a batched step's one per sequence (hetero.llm.batch), a
# speculative verify step's up to 16 (VERIFY_ROWS); the native kernels run them in one region (fused::ROWS, tiles of
# up to their max_mr rows per group: 16 with AMX, 8 on other x86, 4 generic). Prefill keeps its calls: its kernels
# split the work by rows anyway.
ROWS = 16


def _matmul(call: Call) -> tuple | None:
    """(w, x, out, bias) of a bound ``llm_matmul`` of at most ``ROWS`` rows."""
    args = _args(call, _native.llm_matmul, 4)
    if args is None or not isinstance(args[1], np.ndarray) or args[1].size % args[0].k \
            or not 0 < args[1].size // args[0].k <= ROWS:
        return None
    return args


def _residual(mm: tuple, nxt: Call) -> Call | None:
    add = _args(nxt, _native.binary, 4)
    if add is None or add[0] != "add":
        return None
    w, x, out, bias = mm
    a, b, res_out = add[1], add[2], add[3]
    if _same(a, out):
        residual = b
    elif _same(b, out):
        residual = a
    else:
        return None
    if not (isinstance(residual, np.ndarray) and residual.shape == out.shape == res_out.shape
            and residual.dtype == res_out.dtype == np.float32 and residual.flags.c_contiguous
            and res_out.flags.c_contiguous):
        return None
    # res_out may be the residual or out itself (an in-place add), never a partial overlap of either
    if not _apart(out, x, residual) or not (_same(res_out, residual) or _same(res_out, out)
                                            or _apart(res_out, residual, out)):
        return None
    return functools.partial(_native.llm_matmul_residual, w, x, out, bias, residual, res_out)


def _swiglu(g: tuple, u: tuple, nxt: Call) -> Call | None:
    sw = _args(nxt, _native.llm_swiglu, 3)
    if sw is None or not _same(g[1], u[1]) or not _same(sw[0], g[2]) or not _same(sw[1], u[2]):
        return None
    if g[0].n != u[0].n or g[0].k != u[0].k or not _apart(g[1], g[2], u[2]) or not _apart(g[2], u[2], sw[2]):
        return None
    return functools.partial(_native.llm_matmul_swiglu, g[0], u[0], g[1], g[2], u[2], sw[2], g[3], u[3])


def fuse_calls(program: Sequence[Call]) -> list[Call]:
    """``program`` with the patterns above replaced by fused calls (everything else kept, in order)."""
    out: list[Call] = []
    i, n = 0, len(program)
    while i < n:
        mm = _matmul(program[i])
        if mm is None:
            out.append(program[i])
            i += 1
            continue
        if i + 2 < n and (up := _matmul(program[i + 1])) is not None:
            fused = _swiglu(mm, up, program[i + 2])
            if fused is not None:
                out.append(fused)
                i += 3
                continue
        if i + 1 < n:
            fused = _residual(mm, program[i + 1])
            if fused is not None:
                out.append(fused)
                i += 2
                continue
        group = [mm]
        while i + len(group) < n and len(group) < 4:
            nxt = _matmul(program[i + len(group)])
            if nxt is None or not _same(nxt[1], mm[1]):
                break
            group.append(nxt)
        if len(group) > 1 and _apart(mm[1], *(g[2] for g in group)):
            out.append(functools.partial(_native.llm_matmul_multi, [g[0] for g in group], mm[1],
                                         [g[2] for g in group], [g[3] for g in group]))
            i += len(group)
            continue
        out.append(program[i])
        i += 1
    return out


def _step_op(call: Call) -> tuple[str, tuple] | None:
    """(``LlmStep`` method, its arguments) that adds ``call`` to a step, or None if native code cannot take it."""
    if isinstance(call, AttentionCall):
        return "add_attention", (call.cache, call.q, call.k, call.v, call.past, call.scale, call.out)
    if isinstance(call, SlotAttentionCall):  # a lone stream's row on a model of several sequences
        return "add_attention_slot", (call.caches, call.q, call.k, call.v, call.past, call.slot, call.scale,
                                      call.out)
    if not isinstance(call, functools.partial) or call.keywords:
        return None
    func, args = call.func, call.args
    if isinstance(func, _native.LlmRope) and len(args) == 3 and isinstance(args[2], np.ndarray):
        return "add_rope", (func, *args)
    for native, method, n in _STEP_FUNCS:
        if func is native and len(args) == n:
            return method, args
    name = getattr(func, "__name__", None)
    if name is not None and _PREPARED.get(name) is func:  # an ONNX kernel's call (LlmStep.add_call)
        return "add_call", (name, args)
    return None


_STEP_FUNCS = ((_native.llm_matmul, "add_matmul", 4), (_native.llm_matmul_multi, "add_matmul_multi", 4),
               (_native.llm_matmul_swiglu, "add_matmul_swiglu", 8),
               (_native.llm_matmul_residual, "add_matmul_residual", 6), (_native.llm_swiglu, "add_swiglu", 3),
               (_native.rms_norm, "add_rms_norm", 4))
# The other native functions a step takes, prepared from their arguments (``_native.step_ops``: the ONNX kernels'
# GEMMs, convolutions, pools, norms and elementwise ops): a replayed ONNX model of tiny nodes runs as one call.
_PREPARED = {name: getattr(_native, name) for name in _native.step_ops()}


def step_calls(program: Sequence[Call]) -> list[Call]:
    """``program`` with every run of two or more calls that native code takes whole replaced by one ``LlmStep``
    (its ``fallback``: the run's calls). A call whose arguments the step refuses stays a call of its own."""
    out: list[Call] = []
    run: list[Call] = []
    step = _native.LlmStep()

    def flush() -> None:
        nonlocal step
        if len(run) > 1:
            step.fallback = list(run)
            out.append(step)
        else:
            out.extend(run)
        run.clear()
        step = _native.LlmStep()

    for call in program:
        op = _step_op(call)
        if op is not None:
            try:
                getattr(step, op[0])(*op[1])
            except (ValueError, TypeError):  # arguments native code refuses: the call runs on its own
                op = None
        if op is None:
            flush()
            out.append(call)
        else:
            run.append(call)
    flush()
    return out
