"""Control flow: If, Loop and Scan, whose bodies are subgraph attributes run with ``ctx.run_subgraph``.

Their output shapes generally depend on the data (which branch, how many iterations), so they are data-dependent:
statically ``infer`` returns what the subgraph declares (often only the dtype). At run time, where every input value
is known, ``infer`` runs the reference itself to get exact shapes — the only general way, since a body's shapes can
depend on anything it computes. That run sees no outer-scope values (OpContext gives infer none), so a body that reads
names of the enclosing graph gets unknown shapes; see the report in tests/onnx_conformance/expected_failures.toml.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..contract import dtypes
from ..contract.graph import Graph, free_names
from ..contract.registry import OpContext, op
from ..contract.tensor import TensorInfo


def _runner(ctx: OpContext) -> Callable[[Graph, dict[str, np.ndarray]], list[np.ndarray]]:
    if ctx.run_subgraph is not None:
        return ctx.run_subgraph
    from ..runtime.evaluate import run_graph  # late: the runtime imports the op registry

    return run_graph


def _declared(graph: Graph, name: str, fallback: TensorInfo | None = None) -> TensorInfo:
    info = graph.values.get(name)
    if info is not None:
        return info
    return fallback if fallback is not None else TensorInfo(dtypes.float32, None)


def _all_known(ctx: OpContext) -> bool:
    return all(v is not None or i is None for v, i in zip(ctx.values, ctx.inputs, strict=False))


def _by_running(ctx: OpContext, reference: Callable[[OpContext], list[np.ndarray]],
                static: Callable[[OpContext], list[TensorInfo]]) -> list[TensorInfo]:
    """Exact infos by running the op when every value is known, and the outer scope too if the bodies read it
    (the session passes a scoped ``run_subgraph`` at run time; the static pass has none)."""
    subgraphs = [g for g in ctx.node.attrs.values() if isinstance(g, Graph)]
    scope_ok = ctx.run_subgraph is not None or not any(free_names(g) for g in subgraphs)
    if _all_known(ctx) and scope_ok:
        outs = reference(ctx)
        return [TensorInfo(dtypes.from_numpy(o.dtype), tuple(o.shape)) for o in outs]
    return static(ctx)


# -- If ------------------------------------------------------------------------------------------------------------
def _if_static(ctx: OpContext) -> list[TensorInfo]:
    then_g, else_g = ctx.attr("then_branch"), ctx.attr("else_branch")
    cond = ctx.value(0)
    if cond is not None:
        branch = then_g if bool(np.asarray(cond).reshape(-1)[0]) else else_g
        return [_declared(branch, n) for n in branch.outputs]
    infos = []
    for a, b in zip(then_g.outputs, else_g.outputs, strict=True):
        ia, ib = _declared(then_g, a), _declared(else_g, b)
        infos.append(ia if ia == ib else TensorInfo(ia.dtype, None))
    return infos


def _if_reference(ctx: OpContext) -> list[np.ndarray]:
    cond = bool(np.asarray(ctx.array(0)).reshape(-1)[0])
    branch = ctx.attr("then_branch") if cond else ctx.attr("else_branch")
    return [np.asarray(v) for v in _runner(ctx)(branch, {})]


@op("If", infer=lambda ctx: _by_running(ctx, _if_reference, _if_static), data_dependent=True)
def if_(ctx: OpContext) -> list[np.ndarray]:
    """Run then_branch or else_branch depending on the boolean condition; its outputs are the op's outputs."""
    return _if_reference(ctx)


# -- Loop ----------------------------------------------------------------------------------------------------------
def _loop_static(ctx: OpContext) -> list[TensorInfo]:
    body: Graph = ctx.attr("body")
    carried = [ctx.inputs[i] for i in range(2, len(ctx.inputs))]
    n_carried = len(carried)
    infos = [_declared(body, body.outputs[1 + k], carried[k]) for k in range(n_carried)]
    for name in body.outputs[1 + n_carried :]:
        per = _declared(body, name)
        infos.append(TensorInfo(per.dtype, None if per.shape is None else (None, *per.shape)))
    return infos


def _loop_reference(ctx: OpContext) -> list[np.ndarray]:
    body: Graph = ctx.attr("body")
    run = _runner(ctx)
    trip = ctx.array(0) if ctx.has_input(0) else None
    cond = ctx.array(1) if ctx.has_input(1) else None
    max_trip = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
    keep_going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    carried = [ctx.array(i) for i in range(2, len(ctx.inputs))]
    n_carried = len(carried)
    scans: list[list[np.ndarray]] = [[] for _ in body.outputs[1 + n_carried :]]
    i = 0
    while keep_going and (max_trip is None or i < max_trip):
        feeds = {body.inputs[0]: np.array(i, dtype=np.int64), body.inputs[1]: np.array(keep_going)}
        feeds.update(dict(zip(body.inputs[2:], carried, strict=True)))
        outs = run(body, feeds)
        keep_going = bool(np.asarray(outs[0]).reshape(-1)[0])
        carried = [np.asarray(v) for v in outs[1 : 1 + n_carried]]
        for k, v in enumerate(outs[1 + n_carried :]):
            scans[k].append(np.asarray(v))
        i += 1
    stacked = []
    for k, name in enumerate(body.outputs[1 + n_carried :]):
        if scans[k]:
            stacked.append(np.stack(scans[k]))
        else:
            per = _declared(body, name)
            dims = [] if per.shape is None else [d or 0 for d in per.shape]
            stacked.append(np.zeros((0, *dims), dtype=per.dtype.np_dtype))
    return [*carried, *stacked]


@op("Loop", infer=lambda ctx: _by_running(ctx, _loop_reference, _loop_static), data_dependent=True)
def loop(ctx: OpContext) -> list[np.ndarray]:
    """Run the body while the condition holds and fewer than M iterations ran; stack its scan outputs."""
    return _loop_reference(ctx)


# -- Scan ----------------------------------------------------------------------------------------------------------
def _scan_static(ctx: OpContext) -> list[TensorInfo]:
    body: Graph = ctx.attr("body")
    n_scan = ctx.attr("num_scan_inputs")
    offset = 1 if ctx.opset < 9 else 0
    n_state = len(ctx.inputs) - offset - n_scan
    infos = [_declared(body, body.outputs[k], ctx.inputs[offset + k]) for k in range(n_state)]
    infos += [TensorInfo(_declared(body, n).dtype, None) for n in body.outputs[n_state:]]
    return infos


def _scan_once(ctx: OpContext, states: list[np.ndarray], xs: list[np.ndarray], in_axes: list[int],
               in_dirs: list[int], out_axes: list[int], out_dirs: list[int]) -> list[np.ndarray]:
    body: Graph = ctx.attr("body")
    run = _runner(ctx)
    n_state = len(states)
    xs = [np.moveaxis(x, a, 0) for x, a in zip(xs, in_axes, strict=True)]
    xs = [x[::-1] if d else x for x, d in zip(xs, in_dirs, strict=True)]
    steps = xs[0].shape[0] if xs else 0
    collected: list[list[np.ndarray]] = [[] for _ in body.outputs[n_state:]]
    for t in range(steps):
        feeds = dict(zip(body.inputs[:n_state], states, strict=True))
        feeds.update({name: x[t] for name, x in zip(body.inputs[n_state:], xs, strict=True)})
        outs = run(body, feeds)
        states = [np.asarray(v) for v in outs[:n_state]]
        for k, v in enumerate(outs[n_state:]):
            collected[k].append(np.asarray(v))
    results = []
    for k, name in enumerate(body.outputs[n_state:]):
        if collected[k]:
            y = np.stack(collected[k])
        else:
            per = _declared(body, name)
            y = np.zeros((0, *[d or 0 for d in per.shape or ()]), dtype=per.dtype.np_dtype)
        y = y[::-1] if out_dirs[k] else y
        results.append(np.moveaxis(y, 0, out_axes[k]))
    return [*states, *results]


def _axes(ctx: OpContext, name: str, n: int, ranks: list[int]) -> list[int]:
    axes = list(ctx.attr(name, None) or [0] * n)
    return [a + r if a < 0 else a for a, r in zip(axes, ranks, strict=True)]


def _scan_reference(ctx: OpContext) -> list[np.ndarray]:
    body: Graph = ctx.attr("body")
    n_scan = ctx.attr("num_scan_inputs")
    if ctx.opset < 9:
        # Opset 8: a leading batch axis on every input and an optional sequence_lens input first.
        n_state = len(ctx.inputs) - 1 - n_scan
        states = [ctx.array(i) for i in range(1, 1 + n_state)]
        xs = [ctx.array(i) for i in range(1 + n_state, len(ctx.inputs))]
        dirs = list(ctx.attr("directions", None) or [0] * n_scan)
        n_out = len(body.outputs) - n_state
        per_batch = [_scan_once(ctx, [s[b] for s in states], [x[b] for x in xs], [0] * n_scan, dirs,
                                [0] * n_out, [0] * n_out) for b in range(xs[0].shape[0])]
        return [np.stack([r[k] for r in per_batch]) for k in range(len(per_batch[0]))]
    n_state = len(ctx.inputs) - n_scan
    states = [ctx.array(i) for i in range(n_state)]
    xs = [ctx.array(i) for i in range(n_state, len(ctx.inputs))]
    n_out = len(body.outputs) - n_state
    in_axes = _axes(ctx, "scan_input_axes", n_scan, [x.ndim for x in xs])
    in_dirs = list(ctx.attr("scan_input_directions", None) or [0] * n_scan)
    out_axes_raw = list(ctx.attr("scan_output_axes", None) or [0] * n_out)
    out_dirs = list(ctx.attr("scan_output_directions", None) or [0] * n_out)
    # Output axes count in the stacked rank (per-step rank + 1); resolve negatives after stacking.
    results = _scan_once(ctx, states, xs, in_axes, in_dirs, [0] * n_out, out_dirs)
    outs = results[:n_state]
    for y, a in zip(results[n_state:], out_axes_raw, strict=True):
        outs.append(np.moveaxis(y, 0, a + y.ndim if a < 0 else a))
    return outs


@op("Scan", infer=lambda ctx: _by_running(ctx, _scan_reference, _scan_static), data_dependent=True)
def scan(ctx: OpContext) -> list[np.ndarray]:
    """Iterate the body over slices of the scan inputs, threading state variables; stack the scan outputs."""
    return _scan_reference(ctx)
