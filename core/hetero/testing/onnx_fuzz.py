"""Graph mutation for fuzzing the ONNX front end and the sessions of every backend.

``mutate(model, choose)`` applies a few structural mutations to a ModelProto (attribute values pushed to extremes,
inputs dropped or rewired, types removed or changed, declared dims and initializer values replaced, nodes reordered,
dropped or given another op) — the kinds of damage that found native heap corruption, hangs, memory bombs and raw
exceptions (issue 19). ``choose`` is any object with ``randrange(n)``: a ``random.Random`` for the hypothesis /
seeded runs, or ``ByteChooser`` over a coverage-guided fuzzer's input (atheris).

``run_case(case)`` is the child-process target (see ``hetero.testing.fuzz.ChildRunner``): it loads the model,
makes a session on the case's backend and runs it on generated feeds. ``encode_case`` makes its input.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

EXTREME_INTS = (0, 1, -1, 2, 3, 7, 1000, 2**31 - 1, -(2**31), 2**62, -(2**62))
FEED_ELEMENTS = 1 << 16  # a declared input larger than this is fed as is not (the case is skipped)
BACKENDS = ("reference", "cpu", "opencl")


class Chooser(Protocol):
    def randrange(self, n: int) -> int: ...


class ByteChooser:
    """Choices read from a fuzzer's bytes (one or two bytes per choice; zeros once they run out)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def randrange(self, n: int) -> int:
        width = 1 if n <= 256 else 2
        chunk = self.data[self.pos:self.pos + width]
        self.pos += width
        return int.from_bytes(chunk.ljust(width, b"\0"), "little") % max(n, 1)


def _pick(choose: Chooser, items: Sequence[Any]) -> Any:
    return items[choose.randrange(len(items))]


def _value_names(graph: Any) -> list[str]:
    names = [v.name for v in graph.input] + [t.name for t in graph.initializer]
    return names + [o for n in graph.node for o in n.output if o]


def _nodes_with_subgraphs(graph: Any) -> list[Any]:
    """Every node of ``graph`` and of its subgraphs (If / Loop / Scan bodies)."""
    out = []
    for node in graph.node:
        out.append(node)
        for attr in node.attribute:
            if attr.HasField("g"):
                out.extend(_nodes_with_subgraphs(attr.g))
            for g in attr.graphs:
                out.extend(_nodes_with_subgraphs(g))
    return out


# -- the mutations: each changes ``model`` in place and returns False when it found nothing to change --------------
def _attr_extreme(model: Any, choose: Chooser) -> bool:
    attrs = [a for n in _nodes_with_subgraphs(model.graph) for a in n.attribute if a.type in (a.INT, a.INTS)]
    if not attrs:
        return False
    attr = _pick(choose, attrs)
    if attr.type == attr.INT:
        attr.i = _pick(choose, EXTREME_INTS)
    elif len(attr.ints):
        attr.ints[choose.randrange(len(attr.ints))] = _pick(choose, EXTREME_INTS)
    else:
        attr.ints.append(_pick(choose, EXTREME_INTS))
    return True


def _attr_drop(model: Any, choose: Chooser) -> bool:
    nodes = [n for n in _nodes_with_subgraphs(model.graph) if len(n.attribute)]
    if not nodes:
        return False
    node = _pick(choose, nodes)
    del node.attribute[choose.randrange(len(node.attribute))]
    return True


def _input_drop(model: Any, choose: Chooser) -> bool:
    nodes = [n for n in model.graph.node if len(n.input)]
    if not nodes:
        return False
    node = _pick(choose, nodes)
    if choose.randrange(2):
        node.input[choose.randrange(len(node.input))] = ""
    else:
        del node.input[-1]
    return True


def _input_rewire(model: Any, choose: Chooser) -> bool:
    nodes = [n for n in model.graph.node if len(n.input)]
    names = _value_names(model.graph)
    if not nodes or not names:
        return False
    node = _pick(choose, nodes)
    node.input[choose.randrange(len(node.input))] = _pick(choose, names)
    return True


def _untype(model: Any, choose: Chooser) -> bool:
    """Leave a graph output, a value_info or a subgraph output without a type: known only at run time."""
    graphs = [model.graph] + [a.g for n in _nodes_with_subgraphs(model.graph) for a in n.attribute if a.HasField("g")]
    infos = [vi for g in graphs for vi in [*g.output, *g.value_info]]
    if not infos:
        return False
    _pick(choose, infos).ClearField("type")
    return True


_DTYPES = (1, 10, 7, 6, 2, 3, 9, 11, 16)  # float, float16, int64, int32, uint8, int8, bool, double, bfloat16


def _retype(model: Any, choose: Chooser) -> bool:
    infos = [vi for vi in [*model.graph.input, *model.graph.output] if vi.type.HasField("tensor_type")]
    if not infos:
        return False
    _pick(choose, infos).type.tensor_type.elem_type = _pick(choose, _DTYPES)
    return True


def _redim(model: Any, choose: Chooser) -> bool:
    dims = [d for vi in [*model.graph.input, *model.graph.output] if vi.type.HasField("tensor_type")
            for d in vi.type.tensor_type.shape.dim]
    if not dims:
        return False
    dim = _pick(choose, dims)
    if choose.randrange(4) == 0:
        dim.dim_param = "n"
    else:
        dim.dim_value = _pick(choose, (0, 1, 2, 5, 64, 2**20, 2**40))
    return True


def _initializer_values(model: Any, choose: Chooser) -> bool:
    """New values for a small initializer (shapes, axes, indices, counts): extremes of its own dtype."""
    from onnx import numpy_helper

    small = [t for t in model.graph.initializer if math.prod(t.dims) <= 16 and not t.external_data]
    if not small:
        return False
    tensor = _pick(choose, small)
    try:
        array = numpy_helper.to_array(tensor).copy()
    except (ValueError, TypeError):
        return False
    if array.size == 0 or array.dtype.kind not in "iuf":
        return False
    flat = array.reshape(-1)
    i = choose.randrange(flat.size)
    if array.dtype.kind == "f":
        flat[i] = _pick(choose, (0.0, -1.0, 1e30, float("nan"), float("inf"), 2.0**62))
    else:
        info = np.iinfo(array.dtype)
        flat[i] = min(max(_pick(choose, EXTREME_INTS), info.min), info.max)
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    return True


def _initializer_dims(model: Any, choose: Chooser) -> bool:
    if not len(model.graph.initializer):
        return False
    tensor = model.graph.initializer[choose.randrange(len(model.graph.initializer))]
    if len(tensor.dims) and choose.randrange(2):
        tensor.dims[choose.randrange(len(tensor.dims))] = _pick(choose, (0, 1, 3, 2**31, 2**62))
    else:
        tensor.dims.append(_pick(choose, (0, 1, 2)))
    return True


def _reorder(model: Any, choose: Chooser) -> bool:
    nodes = list(model.graph.node)
    if len(nodes) < 2:
        return False
    order = nodes[::-1] if choose.randrange(2) else nodes[1:] + nodes[:1]
    del model.graph.node[:]
    model.graph.node.extend(order)
    return True


def _node_drop(model: Any, choose: Chooser) -> bool:
    if len(model.graph.node) < 2:
        return False
    del model.graph.node[choose.randrange(len(model.graph.node))]
    return True


# Ops that take the same inputs as one another, to swap between.
_SAME_ARITY = (("Relu", "Sigmoid", "Neg", "Abs", "Identity", "Softmax", "Shape", "Size", "NonZero", "Flatten",
                "Transpose", "Squeeze", "Sqrt", "Exp", "Not"),
               ("Add", "Mul", "Sub", "Div", "MatMul", "Concat", "Reshape", "Expand", "Gather", "Tile", "Equal", "Max",
                "Pow", "ConstantOfShape"))


def _op_swap(model: Any, choose: Chooser) -> bool:
    nodes = [n for n in _nodes_with_subgraphs(model.graph) if not n.domain or n.domain == "ai.onnx"]
    if not nodes:
        return False
    node = _pick(choose, nodes)
    family = _SAME_ARITY[0] if len(node.input) <= 1 else _SAME_ARITY[1]
    node.op_type = _pick(choose, family)
    return True


MUTATIONS: dict[str, Callable[[Any, Chooser], bool]] = {
    "attr_extreme": _attr_extreme, "attr_drop": _attr_drop, "input_drop": _input_drop,
    "input_rewire": _input_rewire, "untype": _untype, "retype": _retype, "redim": _redim,
    "initializer_values": _initializer_values, "initializer_dims": _initializer_dims, "reorder": _reorder,
    "node_drop": _node_drop, "op_swap": _op_swap,
}


def mutate(model: Any, choose: Chooser, count: int | None = None) -> tuple[Any, list[str]]:
    """A mutated copy of ``model`` and the names of the mutations applied (1-3 unless ``count``)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    applied = []
    names = list(MUTATIONS)
    for _ in range(count if count is not None else 1 + choose.randrange(3)):
        name = _pick(choose, names)
        if MUTATIONS[name](out, choose):
            applied.append(name)
    return out, applied


# -- the child-process side ------------------------------------------------------------------------------------------
def encode_case(backend: str, model: bytes) -> bytes:
    return backend.encode() + b"\n" + model


def decode_case(case: bytes) -> tuple[str, bytes]:
    backend, _, model = case.partition(b"\n")
    return backend.decode(), model


def feeds_for(session: Any, seed: int = 0) -> dict[str, np.ndarray] | None:
    """Deterministic values for every input of ``session`` (unknown dims: 2); None when one would be too large."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in session.graph.inputs:
        info = session.graph.values.get(name)
        if info is None or info.dtype.np_dtype is None:
            return None
        shape = tuple(2 if d is None else int(d) for d in (info.shape or (2,)))
        if math.prod(shape) > FEED_ELEMENTS:
            return None
        dtype = np.dtype(info.dtype.np_dtype)
        if dtype.kind in "OSU":
            value = np.full(shape, "a", dtype=object)
        elif dtype.kind == "b":
            value = rng.integers(0, 2, shape).astype(bool)
        elif dtype.kind in "iu":
            value = rng.integers(0, 3, shape).astype(dtype)
        else:
            value = rng.standard_normal(shape).astype(dtype)
        feeds[name] = value
    return feeds


def run_case(case: bytes) -> None:
    """Load, place on the case's backend and run; HeteroError is a clean refusal (the runner's 'refused')."""
    import warnings

    import hetero

    backend, model = decode_case(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = hetero.Session(model, backends=[backend], on_fallback="silent")
        feeds = feeds_for(session)
        if feeds is not None:
            session.run(feeds)


# -- the coverage-guided long run ------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> None:
    """python -m hetero.testing.onnx_fuzz --backend cpu --seeds DIR [libFuzzer flags]: atheris mutates the choices
    (first byte: the seed model; the rest: ``ByteChooser``), guided by the coverage of hetero and its plugins.
    Run it with libFuzzer's fork mode so that each input runs in a child (crashes, hangs and memory bombs are kept
    as findings): e.g. ``-fork=2 -timeout=60 -rss_limit_mb=6144 -max_total_time=3600 -artifact_prefix=findings/``.
    Needs ``pip install atheris`` (not a dependency of hetero)."""
    import argparse
    import sys
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m hetero.testing.onnx_fuzz", description=main.__doc__)
    parser.add_argument("--backend", default="cpu", choices=BACKENDS)
    parser.add_argument("--seeds", type=Path, required=True, help="a folder of .onnx seed models")
    args, libfuzzer_args = parser.parse_known_args(argv)
    try:
        import atheris
    except ImportError:
        raise SystemExit("the coverage-guided run needs atheris: pip install atheris") from None
    import onnx

    import hetero
    from hetero.contract.errors import HeteroError

    seeds = [p.read_bytes() for p in sorted(args.seeds.glob("*.onnx"))]
    if not seeds:
        raise SystemExit(f"no .onnx seed models in {args.seeds}")
    hetero.backends()  # imports the plugins, so that their Python is instrumented below
    atheris.instrument_all()

    def one_input(data: bytes) -> None:
        if not data:
            return
        model = onnx.ModelProto()
        model.ParseFromString(seeds[data[0] % len(seeds)])
        mutated, _ = mutate(model, ByteChooser(data[1:]))
        with contextlib.suppress(HeteroError):  # a clean refusal
            run_case(encode_case(args.backend, mutated.SerializeToString()))

    atheris.Setup([sys.argv[0], *libfuzzer_args], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
