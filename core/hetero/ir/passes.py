"""Graph passes that run after constant folding: no-op removal, Conv+BatchNorm folding, and fusion of a producer
with its activation (Conv, MatMul+bias) into the hetero-domain ops of ``hetero.ops.fused``.

Each pass rewrites a node only when the value it removes has a single consumer and is no graph output, so the
graph computes exactly what it computed before.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..contract.graph import HETERO_DOMAIN, Graph, Node, free_names

Pass = Callable[[Graph], int]  # returns how many rewrites it made


def _single_consumer(graph: Graph, name: str) -> Node | None:
    if name in graph.outputs:
        return None
    users = graph.consumers().get(name, [])
    return users[0] if len(users) == 1 and users[0].inputs.count(name) == 1 else None


def _rename_input(graph: Graph, old: str, new: str) -> None:
    for node in graph.nodes:
        node.inputs = [new if n == old else n for n in node.inputs]


def _read_by_subgraphs(graph: Graph) -> set[str]:
    """Names that control-flow bodies read from this graph: rewrites leave them alone (bodies may be shared)."""
    return {name for node in graph.nodes for sub in node.attrs.values() if isinstance(sub, Graph)
            for name in free_names(sub)}


def remove_noops(graph: Graph) -> int:
    """Identity, and Dropout in inference (no mask consumer): their consumers read the input directly."""
    count = 0
    keep = _read_by_subgraphs(graph)
    for node in list(graph.nodes):
        is_noop = node.domain == "" and (
            node.op_type == "Identity"
            or (node.op_type == "Dropout" and not node.attrs.get("training_mode")
                and (len(node.outputs) < 2 or not node.outputs[1] or not graph.consumers().get(node.outputs[1]))
                and len(node.inputs) < 3)
        )
        if not is_noop or node.outputs[0] in graph.outputs or node.outputs[0] in keep or not node.inputs[0]:
            continue
        graph.nodes.remove(node)
        _rename_input(graph, node.outputs[0], node.inputs[0])
        count += 1
    return count


def fold_conv_batchnorm(graph: Graph) -> int:
    """Conv with constant weights followed by inference BatchNormalization: scale the weights, shift the bias."""
    count = 0
    for conv in list(graph.nodes):
        if conv.op_key != ("", "Conv") or len(conv.inputs) < 2 or conv.inputs[1] not in graph.initializers:
            continue
        bn = _single_consumer(graph, conv.outputs[0])
        if bn is None or bn.op_key != ("", "BatchNormalization") or bn.attrs.get("training_mode"):
            continue
        if len([o for o in bn.outputs if o]) != 1 or not all(n in graph.initializers for n in bn.inputs[1:5]):
            continue
        if len(conv.inputs) > 2 and conv.inputs[2] and conv.inputs[2] not in graph.initializers:
            continue
        w = np.asarray(graph.initializers[conv.inputs[1]])
        scale, shift, mean, var = (np.asarray(graph.initializers[n], np.float64) for n in bn.inputs[1:5])
        if w.dtype != np.float32 or scale.shape != (w.shape[0],):
            continue
        bias = (np.asarray(graph.initializers[conv.inputs[2]], np.float64)
                if len(conv.inputs) > 2 and conv.inputs[2] else np.zeros(w.shape[0]))
        with np.errstate(invalid="ignore", divide="ignore"):  # a broken model's statistics stay its own problem
            mul = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        w_name, b_name = f"{conv.name}/folded_w", f"{conv.name}/folded_b"
        graph.initializers[w_name] = (w * mul.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32)
        graph.initializers[b_name] = ((bias - mean) * mul + shift).astype(np.float32)
        conv.inputs = [conv.inputs[0], w_name, b_name]
        conv.outputs = [bn.outputs[0]]
        graph.nodes.remove(bn)
        count += 1
    return count


_SIMPLE_ACTIVATIONS = {"Relu": (), "Sigmoid": (), "Tanh": (), "HardSwish": (), "LeakyRelu": ("alpha",),
                       "HardSigmoid": ("alpha", "beta")}


def _activation_of(graph: Graph, node: Node) -> tuple[dict, list[Node]] | None:
    """The activation that alone consumes ``node``'s output: its attributes and the nodes it spans."""
    out = node.outputs[0]
    users = graph.consumers().get(out, [])
    if out in graph.outputs:
        return None
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


def _absorb(graph: Graph, node: Node, spanned: list[Node]) -> None:
    node.outputs = [spanned[-1].outputs[0]]
    for other in spanned:
        graph.nodes.remove(other)


def fuse_conv_activation(graph: Graph) -> int:
    count = 0
    for conv in list(graph.nodes):
        if conv.op_key != ("", "Conv") or conv not in graph.nodes:
            continue
        found = _activation_of(graph, conv)
        if found is None:
            continue
        attrs, spanned = found
        conv.op_type, conv.domain = "FusedConv", HETERO_DOMAIN
        conv.attrs.update(attrs)
        _absorb(graph, conv, spanned)
        count += 1
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


DEFAULT_PASSES: tuple[Pass, ...] = (remove_noops, fold_conv_batchnorm, fuse_conv_activation, fuse_matmul_bias)


def optimize(graph: Graph, passes: tuple[Pass, ...] = DEFAULT_PASSES) -> dict[str, int]:
    """Run each pass once; returns the number of rewrites per pass (for reports and tests)."""
    return {p.__name__: p(graph) for p in passes}
