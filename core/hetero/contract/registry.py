"""Op schemas: for each op, its shape inference and its numpy reference implementation.

A leaf: importing ``hetero.ops`` fills it with the built-in ops, plugin discovery (``hetero.plugins``) with the
ops of the ``hetero_register_ops`` hook; it never starts discovery itself.

Every op hetero knows has exactly one schema here. Backends implement kernels for ops; the reference
implementation is the last link of the fallback chain and the oracle backends are tested against.

``infer`` runs twice over: statically at load time, where dims may be ``None`` and only constant inputs have values,
and at run time with concrete shapes and the values of ``value_inputs`` (the inputs whose *values* decide output
shapes, e.g. Reshape's target shape). It must give exact shapes whenever its inputs are fully known.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..contract.errors import HeteroError, ShapeError, UnsupportedOp
from ..contract.graph import Node
from ..contract.tensor import TensorInfo

_REQUIRED = object()


class OpContext:
    """What an op's ``infer`` or ``reference`` sees of one node: attributes, input infos and known input values."""

    __slots__ = ("inputs", "node", "opset", "run_subgraph", "state", "values")

    def __init__(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        values: Sequence[np.ndarray | None],
        opset: int,
        run_subgraph: Callable[..., list[np.ndarray]] | None = None,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.node = node
        self.inputs = list(inputs)
        self.values = list(values)
        self.opset = opset
        # Executes a subgraph attribute (If/Loop/Scan): run_subgraph(graph, feeds: dict) -> outputs.
        self.run_subgraph = run_subgraph
        # Stateful ops (an attention layer's KV cache, a recurrent state) keep it here, one dict per node and
        # session; positions are explicit inputs, so rolling back is passing an earlier position.
        self.state = state

    def attr(self, name: str, default: Any = _REQUIRED) -> Any:
        if name in self.node.attrs:
            return self.node.attrs[name]
        if default is _REQUIRED:
            raise ShapeError(f"{self.node.label()} is missing its required attribute {name!r}")
        return default

    def has_input(self, index: int) -> bool:
        return index < len(self.inputs) and self.inputs[index] is not None

    def value(self, index: int) -> np.ndarray | None:
        """The value of input ``index`` if known (always known when the reference runs), else None."""
        return self.values[index] if index < len(self.values) else None

    def array(self, index: int) -> np.ndarray:
        """The value of input ``index``, which must be present: what a reference reads of its required inputs."""
        value = self.value(index)
        if value is None:
            raise self.fail(f"input {index} has no value")
        return value

    def fail(self, message: str) -> ShapeError:
        return ShapeError(f"{self.node.label()}: {message}")


InferFn = Callable[[OpContext], list[TensorInfo]]
ReferenceFn = Callable[[OpContext], list[np.ndarray]]


@dataclass(frozen=True)
class OpSchema:
    name: str
    infer: InferFn
    reference: ReferenceFn
    domain: str = ""
    # Inputs whose values (not only shapes) decide the output shapes.
    value_inputs: tuple[int, ...] = ()
    # Output shapes depend on the *data* (NonZero, Unique): shapes are only known after running.
    data_dependent: bool = False
    # Ops whose result changes from one call to the next (random ops, stateful ops) are never constant-folded.
    nondeterministic: bool = False
    # Ops that keep state between runs (KV caches): ``ctx.state`` is a per-node dict that lives as long as the kernel.
    stateful: bool = False
    doc: str = ""


_SCHEMAS: dict[tuple[str, str], OpSchema] = {}


def register(schema: OpSchema, *, replace: bool = False) -> OpSchema:
    key = (schema.domain, schema.name)
    if key in _SCHEMAS and not replace:
        raise HeteroError(f"op {schema.domain or 'ai.onnx'}::{schema.name} is registered twice")
    _SCHEMAS[key] = schema
    return schema


def op(
    name: str,
    *,
    infer: InferFn,
    domain: str = "",
    value_inputs: tuple[int, ...] = (),
    data_dependent: bool = False,
    nondeterministic: bool = False,
    stateful: bool = False,
) -> Callable[[ReferenceFn], ReferenceFn]:
    """Decorator form: ``@op("Relu", infer=same_as_input(0))`` above the reference implementation."""

    def wrap(reference: ReferenceFn) -> ReferenceFn:
        register(
            OpSchema(
                name, infer, reference, domain, value_inputs, data_dependent, nondeterministic or stateful,
                stateful, doc=(reference.__doc__ or "").strip(),
            )
        )
        return reference

    return wrap


def get(domain: str, name: str) -> OpSchema:
    schema = _SCHEMAS.get((domain, name))
    if schema is None:
        raise UnsupportedOp(
            f"op {domain or 'ai.onnx'}::{name} is unknown to hetero (no schema, so no backend can run it)",
            hint="a plugin can add ops through the hetero_register_ops hook (plugins are discovered by hetero.load, "
            "a Session or hetero.backends())",
        )
    return schema


def find(domain: str, name: str) -> OpSchema | None:
    try:
        return get(domain, name)
    except UnsupportedOp:
        return None


def all_schemas() -> list[OpSchema]:
    """Every schema registered so far: the built-in ones (``import hetero`` registers them) and, once discovery ran,
    the plugins' ones."""
    return sorted(_SCHEMAS.values(), key=lambda s: (s.domain, s.name))
