"""The conformance cases: a table of representative ops, each turned into a single-node ONNX model with seeded inputs.

A case lists its inputs (random data of a given shape and range, or fixed initializers such as shapes, axes and
indices) and its attributes. ``build_model`` writes the model, ``make_feeds`` the runtime inputs; both are
deterministic, so a failure reproduces from the case id alone.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..contract import dtypes


@dataclass(frozen=True)
class Input:
    """One input of a case: random values in [low, high), or a fixed ``value``; ``const`` makes it an initializer."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float = -3.0
    high: float = 3.0
    value: tuple[Any, ...] | None = None
    const: bool = False

    @property
    def is_initializer(self) -> bool:
        return self.const or self.value is not None


@dataclass(frozen=True, eq=False)
class Case:
    op: str
    inputs: tuple[Input | None, ...]  # None: an omitted optional input
    attrs: Mapping[str, Any] = field(default_factory=dict)
    tag: str = ""  # tells the variants of one op apart
    outputs: int = 1
    domain: str = ""
    opset: int = 21

    @property
    def id(self) -> str:
        detail = self.tag or ",".join("x".join(map(str, i.shape)) or "scalar" for i in self.inputs if i is not None)
        first = next((i for i in self.inputs if i is not None), None)
        if first is not None and first.dtype != "float32":
            detail += f" {first.dtype}"
        return f"{self.op}[{detail}]"


def x(*shape: int, dtype: str = "float32", low: float = -3.0, high: float = 3.0) -> Input:
    return Input(tuple(shape), dtype, low, high)


def w(*shape: int, dtype: str = "float32", low: float = -1.0, high: float = 1.0) -> Input:
    """A weight: random, but stored in the model as an initializer."""
    return Input(tuple(shape), dtype, low, high, const=True)


def ints(*values: int) -> Input:
    """A fixed int64 vector initializer (shapes, axes, starts, indices)."""
    return Input((len(values),), "int64", value=tuple(values))


def scalar(value: float, dtype: str = "float32") -> Input:
    """A fixed scalar initializer (Clip's bounds)."""
    return Input((), dtype, value=(value,))


def _unary(op: str, low: float = -3.0, high: float = 3.0, **attrs: Any) -> list[Case]:
    return [Case(op, (x(7, low=low, high=high),), attrs), Case(op, (x(2, 3, 4, 5, low=low, high=high),), attrs)]


def _binary(op: str, dtype: str = "float32", low: float = -3.0, high: float = 3.0) -> list[Case]:
    pairs = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1))]  # same shape, trailing, both ways
    return [Case(op, (x(*a, dtype=dtype, low=low, high=high), x(*b, dtype=dtype, low=low, high=high)))
            for a, b in pairs]


CASES: tuple[Case, ...] = (
    # elementwise unary
    *_unary("Relu"), *_unary("Sigmoid"), *_unary("Tanh"), *_unary("Exp"), *_unary("Abs"), *_unary("Neg"),
    *_unary("Erf"), *_unary("Softplus"), *_unary("HardSwish"),
    *_unary("Sqrt", low=0.1), *_unary("Log", low=0.1),
    *_unary("LeakyRelu", alpha=0.1), *_unary("Gelu"),
    Case("Clip", (x(3, 5), scalar(-1.0), scalar(1.5))),
    # elementwise binary, with broadcasting
    *_binary("Add"), *_binary("Sub"), *_binary("Mul"), *_binary("Max"), *_binary("Min"),
    *_binary("Div", low=0.5, high=3.0), *_binary("Pow", low=0.5, high=2.0),
    *_binary("Add", dtype="int64", low=-100, high=100), *_binary("Mul", dtype="int32", low=-100, high=100),
    *_binary("Greater"), *_binary("Equal", dtype="int64", low=0, high=3),
    Case("Where", (x(2, 3, dtype="bool"), x(2, 3), x(3,))),
    # linear algebra
    Case("MatMul", (x(3, 4), x(4, 5))),
    Case("MatMul", (x(2, 3, 4), w(4, 5)), tag="batched,weight"),
    Case("MatMul", (x(2, 1, 3, 4), x(3, 4, 2)), tag="broadcast batch"),
    Case("Gemm", (x(3, 4), w(4, 5), w(5,))),
    Case("Gemm", (x(3, 4), w(5, 4), w(1, 5)), {"transB": 1, "alpha": 0.5, "beta": 2.0}, tag="transB,alpha,beta"),
    # normalization
    Case("Softmax", (x(2, 3, 10),), {"axis": -1}),
    Case("Softmax", (x(4, 6),), {"axis": 0}, tag="axis0"),
    Case("LayerNormalization", (x(2, 3, 8), w(8), w(8)), {"axis": -1, "epsilon": 1e-5}),
    # convolution and pooling
    Case("Conv", (x(1, 3, 8, 8), w(4, 3, 3, 3), w(4)), {"pads": [1, 1, 1, 1]}),
    Case("Conv", (x(2, 4, 9, 9), w(4, 2, 3, 3)), {"strides": [2, 2], "group": 2}, tag="stride2,group2"),
    Case("MaxPool", (x(1, 2, 8, 8),), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    Case("AveragePool", (x(1, 2, 7, 7),), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    Case("GlobalAveragePool", (x(2, 3, 5, 5),)),
    Case("ReduceMean", (x(2, 3, 4), ints(1)), {"keepdims": 1}),
    # data movement
    Case("Reshape", (x(2, 3, 4), ints(4, 6))),
    Case("Reshape", (x(2, 3, 4), ints(-1, 4)), tag="infer -1"),
    Case("Transpose", (x(2, 3, 4),), {"perm": [2, 0, 1]}),
    Case("Concat", (x(2, 3), x(2, 5)), {"axis": 1}),
    Case("Slice", (x(6, 8), ints(1, 0), ints(5, 8), ints(0, 1), ints(2, 3))),
    Case("Gather", (x(5, 4), ints(0, 3, 3)), {"axis": 0}),
    Case("Gather", (x(3, 5), ints(4, 1)), {"axis": 1}, tag="axis1"),
    Case("Cast", (x(2, 3),), {"to": 10}, tag="float32->float16"),
    Case("Cast", (x(2, 3, low=-50, high=50),), {"to": 6}, tag="float32->int32"),
)


def cases(ops: Iterable[str] | None = None) -> list[Case]:
    """The cases of ``ops`` (default: all); an op missing from the table is an error, not a silent pass."""
    if ops is None:
        return list(CASES)
    wanted = list(ops)
    known = {c.op for c in CASES}
    missing = [op for op in wanted if op not in known]
    if missing:
        raise ValueError(f"no conformance case for {missing}; the table has {sorted(known)}")
    return [c for c in CASES if c.op in wanted]


def _rng(case: Case, salt: str) -> np.random.Generator:
    # Seeded per case (not per run order) so that one failing case reproduces on its own.
    return np.random.default_rng(zlib.crc32(f"{case.id}/{salt}".encode()))


def _array(spec: Input, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(spec.dtype)
    if spec.value is not None:
        return np.array(spec.value, dtype=dtype).reshape(spec.shape)
    if dtype == np.bool_:
        return rng.random(spec.shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(int(spec.low), int(spec.high), size=spec.shape).astype(dtype)
    return rng.uniform(spec.low, spec.high, size=spec.shape).astype(dtype)


def _input_names(case: Case) -> list[str]:
    return ["" if spec is None else f"in{i}" for i, spec in enumerate(case.inputs)]


def make_feeds(case: Case) -> dict[str, np.ndarray]:
    """The runtime inputs of the case's model, by name."""
    rng = _rng(case, "feeds")
    names = _input_names(case)
    return {
        name: _array(spec, rng)
        for name, spec in zip(names, case.inputs, strict=True)
        if spec is not None and not spec.is_initializer
    }


def build_model(case: Case) -> Any:
    """A single-node ONNX model of the case; output types come from ONNX shape inference when the op is ONNX's."""
    import onnx
    from onnx import helper, numpy_helper

    rng = _rng(case, "weights")
    names = _input_names(case)
    graph_inputs, initializers = [], []
    for name, spec in zip(names, case.inputs, strict=True):
        if spec is None:
            continue
        if spec.is_initializer:
            initializers.append(numpy_helper.from_array(_array(spec, rng), name))
        else:
            elem = dtypes.from_numpy(np.dtype(spec.dtype)).onnx_type
            if elem is None:
                raise ValueError(f"input {name} of {spec.dtype} has no ONNX type")
            graph_inputs.append(helper.make_tensor_value_info(name, elem, list(spec.shape)))
    outputs = [f"out{i}" for i in range(case.outputs)]
    node = helper.make_node(case.op, names, outputs, name=case.op.lower(), domain=case.domain, **dict(case.attrs))
    graph = helper.make_graph(
        [node], case.id, graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outputs], initializers
    )
    opsets = [helper.make_opsetid("", case.opset)]
    if case.domain:
        opsets.append(helper.make_opsetid(case.domain, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="hetero.testing")
    if case.domain:
        return model
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    typed = {vi.name: vi for vi in inferred.graph.output}
    del model.graph.output[:]
    model.graph.output.extend(typed[o] for o in outputs)
    return model
