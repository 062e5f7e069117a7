"""A Keras LSTM layer that tf2onnx wrote as a ``Loop`` over the time steps, rewritten as one ONNX ``LSTM``.

tf2onnx turns Keras' ``while`` over an LSTM cell into a Loop whose ~24-node body gathers step ``k`` of the
time-major input, computes ``z = x_k W + h R + b``, splits ``z`` into Keras' four gates (i, f, c, o), updates
``c' = f * c + i * tanh(g)`` and ``h' = o * tanh(c')``, and writes ``h'`` to a scan output. Run as a Loop, every
step costs a child-session run and, in the parent, a step the replay cannot record; as an LSTM the input projections
of all steps are one GEMM and the recurrence runs natively (chars2vec's 2-layer LSTM word embedder).

The rewrite is exact up to the order of the float sums (``x W + h R + b`` against the LSTM's ``x W^T + b`` then
``+ h R^T``) and is made only when every body node is accounted for and the Loop provably runs exactly ``T`` steps
over the ``T`` rows of its input: its trip count and its conditions are ``T`` read from that input's shape.
"""

from __future__ import annotations

import numpy as np

from ..contract import dtypes
from ..contract.graph import Graph, Node
from ..contract.tensor import TensorInfo

_INT_OR_FLOAT = {dtypes.int32.onnx_type, dtypes.int64.onnx_type, dtypes.float32.onnx_type}


def _producers(graph: Graph) -> dict[str, Node]:
    return {o: n for n in graph.nodes for o in n.outputs if o}


def _strip(name: str, producers: dict[str, Node], used: set[int] | None = None) -> str:
    """``name`` with Identity nodes above it skipped (noting them as accounted for in ``used``)."""
    while (node := producers.get(name)) is not None and node.op_key == ("", "Identity"):
        if used is not None:
            used.add(id(node))
        name = node.inputs[0]
    return name


def _const(graph: Graph, name: str, producers: dict[str, Node]) -> np.ndarray | None:
    if name in graph.initializers:
        return np.asarray(graph.initializers[name])
    node = producers.get(name)
    if node is not None and node.op_key == ("", "Constant") and isinstance(node.attrs.get("value"), np.ndarray):
        return np.asarray(node.attrs["value"])
    return None


def _ints(graph: Graph, name: str, producers: dict[str, Node]) -> list[int] | None:
    value = _const(graph, name, producers) if name else None
    return None if value is None or value.dtype.kind not in "iu" else [int(v) for v in value.reshape(-1)]


def _axes(graph: Graph, node: Node, producers: dict[str, Node]) -> list[int] | None:
    if len(node.inputs) > 1 and node.inputs[1]:
        return _ints(graph, node.inputs[1], producers)
    axes = node.attrs.get("axes")
    return None if axes is None else [int(a) for a in axes]


def _length_of(graph: Graph, name: str, x: str, producers: dict[str, Node]) -> bool:
    """Whether ``name`` (a scalar or one-element value) is ``x.shape[0]``: Shape(x) through Casts to int / float,
    a Slice [0:1] or a Gather of index 0, and Squeezes / Reshapes of one element."""
    picked = False  # a Slice [0:1] or a Gather of 0 below: the first element of the shape is what is read
    for _ in range(12):
        node = producers.get(name)
        if node is None or node.domain != "" or not node.inputs:
            return False
        op = node.op_type
        if op == "Shape":
            return picked and node.attrs.get("start", 0) == 0 and node.inputs[0] == x
        if op == "Cast" and node.attrs.get("to") in _INT_OR_FLOAT:
            pass
        elif op == "Squeeze":
            if _axes(graph, node, producers) not in ([0], None):
                return False
        elif op == "Slice":
            if len(node.inputs) < 3 or _ints(graph, node.inputs[1], producers) != [0] \
                    or _ints(graph, node.inputs[2], producers) != [1]:
                return False
            if len(node.inputs) > 3 and node.inputs[3] and _ints(graph, node.inputs[3], producers) not in ([0], [-1]):
                return False
            if len(node.inputs) > 4 and node.inputs[4] and _ints(graph, node.inputs[4], producers) != [1]:
                return False
            picked = True
        elif op == "Gather":
            if node.attrs.get("axis", 0) != 0 or _ints(graph, node.inputs[1], producers) != [0]:
                return False
            picked = True
        else:
            return False
        name = node.inputs[0]
    return False


def _is_zero_less_than_length(graph: Graph, name: str, x: str, producers: dict[str, Node]) -> bool:
    """``0 < x.shape[0]`` (a Less of a constant 0), or ``And`` of it with itself (tf2onnx's initial condition)."""
    node = producers.get(name)
    if node is None or node.domain != "":
        return False
    if node.op_type == "And" and len(node.inputs) == 2:
        return all(_is_zero_less_than_length(graph, n, x, producers) for n in node.inputs)
    if node.op_type != "Less" or len(node.inputs) != 2:
        return False
    zero = _const(graph, node.inputs[0], producers)
    return zero is not None and zero.size == 1 and zero.reshape(-1)[0] == 0 \
        and _length_of(graph, node.inputs[1], x, producers)


class _Body:
    """What the matcher learns of a Loop body: roles of its inputs and outputs and the nodes it accounted for."""

    def __init__(self, loop: Node, body: Graph) -> None:
        self.loop, self.body = loop, body
        self.producers = _producers(body)
        self.used: set[int] = set()
        self.n_carried = len(loop.inputs) - 2

    def node(self, name: str, op_type: str, n_inputs: int | None = None) -> Node | None:
        """The producer of ``name`` (Identities skipped) if it is ``op_type`` (with ``n_inputs`` inputs)."""
        node = self.producers.get(_strip(name, self.producers, self.used))
        if node is None or node.op_key != ("", op_type) or (n_inputs is not None and len(node.inputs) != n_inputs):
            return None
        self.used.add(id(node))
        return node

    def slot(self, name: str) -> int | None:
        """The carried slot whose body input ``name`` is (Identities skipped)."""
        name = _strip(name, self.producers, self.used)
        inputs = self.body.inputs[2:2 + self.n_carried]
        return inputs.index(name) if name in inputs else None

    def out_of(self, slot: int) -> str:
        return _strip(self.body.outputs[1 + slot], self.producers, self.used)

    def passes_through(self, slot: int) -> bool:
        return self.out_of(slot) == self.body.inputs[2 + slot]

    def outer(self, name: str) -> str | None:
        """The name in the enclosing graph that body value ``name`` is: an unchanged carried value's start, or an
        outer name the body reads."""
        name = _strip(name, self.producers, self.used)
        slot = self.slot(name)
        if slot is not None:
            return self.loop.inputs[2 + slot] if self.passes_through(slot) else None
        defined = set(self.body.inputs) | set(self.body.initializers) | set(self.producers)
        return None if name in defined else name


def _weight(graph: Graph, m: _Body, name: str) -> np.ndarray | None:
    outer = m.outer(name)
    value = None if outer is None else graph.initializers.get(outer)
    if value is None:
        value = m.body.initializers.get(_strip(name, m.producers, m.used))
    value = None if value is None else np.asarray(value)
    return value if value is not None and value.dtype == np.float32 else None


def _pair(m: _Body, node: Node | None, op_a: str, op_b: str) -> tuple[Node, Node] | None:
    """The producers of a binary node's two inputs as (op_a, op_b), in either order."""
    if node is None or len(node.inputs) != 2:
        return None
    for a, b in (node.inputs, node.inputs[::-1]):
        saved = set(m.used)
        na, nb = m.node(a, op_a), m.node(b, op_b)
        if na is not None and nb is not None:
            return na, nb
        m.used = saved
    return None


class _Match:
    def __init__(self) -> None:
        self.x = self.h0 = self.c0 = ""
        # the LSTM's W [1, 4H, I], R [1, 4H, H] and B [1, 8H], in ONNX's gate order
        self.w: np.ndarray = np.zeros((1, 0, 0), np.float32)
        self.r: np.ndarray = np.zeros((1, 0, 0), np.float32)
        self.b: np.ndarray = np.zeros((1, 0), np.float32)
        self.h_slot = self.c_slot = self.k_slot = -1
        self.scan = ""


def _gate_of(m: _Body, sig_or_tanh: Node, split: Node) -> int | None:
    name = _strip(sig_or_tanh.inputs[0], m.producers, m.used)
    return split.outputs.index(name) if name in split.outputs and m.producers.get(name) is split else None


def _match_cell(graph: Graph, m: _Body) -> _Match | None:
    """The LSTM cell's nodes (gates, cell and hidden update, the gathered input) and the weights; None if the body
    is anything else."""
    body, n_carried = m.body, m.n_carried
    if len(body.outputs) != 2 + n_carried or len(body.inputs) != 2 + n_carried:
        return None  # exactly one scan output: the hidden state of each step
    found = _Match()
    scan = body.outputs[1 + n_carried]
    h_new = m.node(scan, "Mul", 2)
    pair = _pair(m, h_new, "Sigmoid", "Tanh")
    if pair is None:
        return None
    o_gate, tanh_c = pair
    c_new = m.node(tanh_c.inputs[0], "Add", 2)
    if c_new is None:
        return None
    mul_pair = (m.node(c_new.inputs[0], "Mul", 2), m.node(c_new.inputs[1], "Mul", 2))
    if None in mul_pair:
        return None
    # one Mul is f * c (a Sigmoid times the carried cell), the other i * tanh(g)
    forget = candidate = None
    f_gate = i_gate = g_tanh = None
    for mul in mul_pair:
        assert mul is not None
        for a, b in (mul.inputs, mul.inputs[::-1]):
            slot = m.slot(b)
            sig = m.producers.get(_strip(a, m.producers))
            if slot is not None and sig is not None and sig.op_key == ("", "Sigmoid") and forget is None:
                forget, f_gate, found.c_slot = mul, sig, slot
                m.used.add(id(sig))
                break
            other = m.producers.get(_strip(b, m.producers))
            if sig is not None and sig.op_key == ("", "Sigmoid") and other is not None \
                    and other.op_key == ("", "Tanh") and candidate is None:
                candidate, i_gate, g_tanh = mul, sig, other
                m.used.update((id(sig), id(other)))
                break
    if forget is None or candidate is None or f_gate is None or i_gate is None or g_tanh is None:
        return None
    split = m.producers.get(_strip(o_gate.inputs[0], m.producers))
    if split is None or split.op_key != ("", "Split") or len(split.outputs) != 4:
        return None
    m.used.add(id(split))
    found_gates = [_gate_of(m, g, split) for g in (i_gate, f_gate, g_tanh, o_gate)]  # Keras' roles i, f, c, o
    gates = [g for g in found_gates if g is not None]
    if len(set(gates)) != 4:
        return None
    axis = int(split.attrs.get("axis", 0))
    if axis not in (1, -1) or split.attrs.get("split") is not None or (len(split.inputs) > 1 and split.inputs[1]):
        return None  # equal parts along the last axis of [batch, 4H] only
    # z = (x W + h R) + b
    z_add = m.node(split.inputs[0], "Add", 2)
    if z_add is None:
        return None
    pre = bias = None
    for a, b in (z_add.inputs, z_add.inputs[::-1]):
        node = m.producers.get(_strip(a, m.producers))
        if node is not None and node.op_key == ("", "Add") and _weight(graph, m, b) is not None:
            pre, bias = node, _weight(graph, m, b)
            m.used.add(id(node))
            break
    mm = _pair(m, pre, "MatMul", "MatMul")
    if mm is None or bias is None:
        return None
    x_mm = h_mm = gather = None
    for mx, mh in (mm, mm[::-1]):
        read = m.producers.get(_strip(mx.inputs[0], m.producers))
        h_slot = m.slot(mh.inputs[0])
        if read is not None and read.op_key == ("", "Gather") and h_slot is not None:
            x_mm, h_mm, gather, found.h_slot = mx, mh, read, h_slot
            m.used.add(id(read))
            break
    if x_mm is None or h_mm is None or gather is None:
        return None
    w, r = _weight(graph, m, x_mm.inputs[1]), _weight(graph, m, h_mm.inputs[1])
    if gather.attrs.get("axis", 0) != 0 or w is None or r is None:
        return None
    x = m.outer(gather.inputs[0])
    k_slot = m.slot(gather.inputs[1])
    if x is None or k_slot is None or gather.inputs[0] in body.inputs:
        return None  # the time-major input read from the enclosing graph, at a carried step counter
    hidden = r.shape[0] if r.ndim == 2 else -1
    if hidden <= 0 or r.shape != (hidden, 4 * hidden) or w.ndim != 2 or w.shape[1] != 4 * hidden \
            or bias.shape != (4 * hidden,):
        return None
    slots = {found.h_slot, found.c_slot, k_slot}
    if len(slots) != 3 or m.out_of(found.h_slot) != _strip(scan, m.producers) \
            or m.out_of(found.c_slot) != _strip(c_new.outputs[0], m.producers):
        return None  # the carried h and c are the step's new ones
    order = [gates[0], gates[3], gates[1], gates[2]]  # ONNX's gate order i, o, f, c
    found.w = np.concatenate([w[:, j * hidden:(j + 1) * hidden] for j in order], axis=1).T[None].copy()
    found.r = np.concatenate([r[:, j * hidden:(j + 1) * hidden] for j in order], axis=1).T[None].copy()
    b_order = np.concatenate([bias[j * hidden:(j + 1) * hidden] for j in order])
    found.b = np.concatenate([b_order, np.zeros_like(b_order)])[None]
    found.x, found.k_slot, found.scan = x, k_slot, scan
    found.h0, found.c0 = m.loop.inputs[2 + found.h_slot], m.loop.inputs[2 + found.c_slot]
    return found


def _match_steps(graph: Graph, m: _Body, found: _Match, outer_producers: dict[str, Node]) -> bool:
    """Whether the Loop runs exactly ``T = x.shape[0]`` steps with the counter at 0, 1, ..., T - 1: the counter
    starts at a constant 0 and adds 1 each step, the trip count is ``T`` and the condition is ``k + 1 < T`` and / or
    ``iteration < T`` (each ``T`` an outer value read from x's shape), starting as ``0 < T`` or absent."""
    loop, body, x = m.loop, m.body, found.x
    start = graph.initializers.get(loop.inputs[2 + found.k_slot])
    if start is None or np.ndim(start) != 0 or np.asarray(start).dtype.kind not in "iu" or int(start) != 0:
        return False  # a scalar (a [1] counter would gather [1, B, I] and split the batch axis)
    k_in, k_out = body.inputs[2 + found.k_slot], m.out_of(found.k_slot)
    add = m.node(k_out, "Add", 2)
    if add is None:
        return False
    one = next((_const(body, b, m.producers) for a, b in (add.inputs, add.inputs[::-1])
                if _strip(a, m.producers) == k_in), None)
    if one is None or one.ndim != 0 or one.dtype.kind not in "iu" or int(one) != 1:
        return False
    if not loop.inputs[0] or not _length_of(graph, loop.inputs[0], x, outer_producers):
        return False  # the trip count: T
    if loop.inputs[1] and not _is_zero_less_than_length(graph, loop.inputs[1], x, outer_producers):
        return False
    terms = [body.outputs[0]]
    seen = 0
    while terms:
        name = terms.pop()
        node = m.node(name, "And", 2)
        if node is not None:
            terms.extend(node.inputs)
            continue
        less = m.node(name, "Less", 2)
        if less is None:
            return False
        a, b = (_strip(n, m.producers, m.used) for n in less.inputs)
        for side in (a, b):
            cast = m.producers.get(side)
            if cast is not None and cast.op_key == ("", "Cast") and cast.attrs.get("to") in _INT_OR_FLOAT:
                m.used.add(id(cast))
        a = _strip(m.producers[a].inputs[0], m.producers, m.used) if a in m.producers and \
            m.producers[a].op_key == ("", "Cast") else a
        b = _strip(m.producers[b].inputs[0], m.producers, m.used) if b in m.producers and \
            m.producers[b].op_key == ("", "Cast") else b
        if a not in (_strip(k_out, m.producers), body.inputs[0]):
            return False  # k + 1 < T stops after step T - 1; iteration < T, with the trip count T, as well
        bound = m.outer(b)
        if bound is None or not _length_of(graph, bound, x, outer_producers):
            return False
        seen += 1
    return seen > 0


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        name, k = f"{base}{k}", k + 1
    taken.add(name)
    return name


def _axis_node(op: str, x: str, axis: int, axes_input: str, out: str) -> Node:
    """A Squeeze / Unsqueeze of one axis: the axes as the input ``axes_input`` (opset 13+), else as the attribute."""
    if axes_input:
        return Node(op, [x, axes_input], [out], name=out)
    return Node(op, [x], [out], {"axes": [axis]}, name=out)


def keras_loop_lstm(graph: Graph) -> int:
    """Each Loop that is a Keras LSTM layer (see the module docstring) becomes ``LSTM`` on its time-major input plus
    Squeezes to the Loop's scan output ([T, B, H]) and final h and c ([B, H]); only when the Loop's other outputs
    (the counter, the unchanged carried values) are unused. Returns the number of Loops rewritten."""
    axes_as_input = graph.opset("") >= 13  # Squeeze / Unsqueeze: axes an input from opset 13, else an attribute
    count = 0
    outer_producers = graph.producers()
    consumers = graph.consumers()
    for loop in list(graph.nodes):
        body = loop.attrs.get("body")
        if loop.op_key != ("", "Loop") or not isinstance(body, Graph) or len(loop.inputs) < 5:
            continue
        if any(isinstance(sub, Graph) for inner in body.nodes for sub in inner.attrs.values()):
            continue
        m = _Body(loop, body)
        found = _match_cell(graph, m)
        if found is None or not _match_steps(graph, m, found, outer_producers):
            continue
        # every body node is part of the pattern (an extra one could be anything)
        if any(id(node) not in m.used for node in body.nodes):
            continue
        kept = {found.h_slot, found.c_slot}
        others = [o for k, o in enumerate(loop.outputs[:m.n_carried]) if k not in kept and o]
        if any(o in graph.outputs or consumers.get(o) for o in others):
            continue
        states = [graph.values.get(found.h0), graph.values.get(found.c0)]
        if any(info is None or info.shape is None or len(info.shape) != 2 for info in states):
            continue  # [B, H] (the LSTM's initial states are [1, B, H])
        x_info = graph.values.get(found.x)
        if x_info is None or x_info.dtype != dtypes.float32 or x_info.shape is None or len(x_info.shape) != 3 \
                or x_info.shape[2] not in (None, found.w.shape[2]):
            continue
        if not loop.outputs[m.n_carried]:
            continue  # the sequence unused: an odd export, left as it is
        p = loop.name or loop.outputs[0]
        hidden = found.r.shape[2]
        taken = set(graph.values) | set(graph.initializers) | set(outer_producers) | set(graph.inputs)
        names = {k: _fresh(f"{p}/lstm_{k}", taken) for k in ("w", "r", "b", "axis0", "axis1", "h0", "c0", "y", "yh",
                                                                "yc")}
        graph.initializers.update({names["w"]: found.w, names["r"]: found.r, names["b"]: found.b})
        if axes_as_input:
            graph.initializers.update({names["axis0"]: np.array([0], np.int64),
                                       names["axis1"]: np.array([1], np.int64)})
        y, yh, yc = (loop.outputs[m.n_carried], loop.outputs[found.h_slot], loop.outputs[found.c_slot])
        ax0, ax1 = (names["axis0"], names["axis1"]) if axes_as_input else ("", "")
        new = [_axis_node("Unsqueeze", found.h0, 0, ax0, names["h0"]),
               _axis_node("Unsqueeze", found.c0, 0, ax0, names["c0"]),
               Node("LSTM", [found.x, names["w"], names["r"], names["b"], "", names["h0"], names["c0"]],
                    [names["y"], names["yh"], names["yc"]], {"hidden_size": hidden}, name=f"{p}/lstm"),
               _axis_node("Squeeze", names["y"], 1, ax1, y)]
        if yh:
            new.append(_axis_node("Squeeze", names["yh"], 0, ax0, yh))
        if yc:
            new.append(_axis_node("Squeeze", names["yc"], 0, ax0, yc))
        for name in (names["y"], names["yh"], names["yc"], names["h0"], names["c0"]):
            graph.values.pop(name, None)
        graph.values[names["y"]] = TensorInfo(dtypes.float32, None)
        at = graph.nodes.index(loop)
        graph.nodes[at:at + 1] = new
        outer_producers, consumers = graph.producers(), graph.consumers()  # for the next Loop (a layer above)
        count += 1
    if count:
        graph.toposort()
    return count
