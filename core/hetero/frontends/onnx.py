"""The ONNX front end: ModelProto -> Graph, with weights read from external data files (sizes checked).

Every defect of the file is reported as a ``ModelFormatError`` naming the file and the tensor, node or field. External
data may only come from files inside the model's own folder.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..contract import dtypes, registry
from ..contract.errors import HeteroError, ModelFormatError, UnsupportedOp
from ..contract.graph import Graph, Node
from ..contract.tensor import TensorInfo

# If / Loop / Scan bodies nested deeper than this are refused at load: every later stage (free names, shape
# inference, child sessions) walks the nesting recursively. Real models nest a few levels (and protobuf parses
# about 30 at most).
MAX_SUBGRAPH_DEPTH = 16


def load_onnx(model: Any) -> Graph:
    import onnx
    from google.protobuf.message import DecodeError

    base_dir: Path | None = None
    source = "<ModelProto>"
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        source = str(path)
        base_dir = path.resolve().parent
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelFormatError(f"cannot read model file {source!r}: {exc.strerror}") from exc
        model = _parse(data, source, onnx, DecodeError)
    elif isinstance(model, (bytes, bytearray, memoryview)):
        source = "<bytes>"
        model = _parse(bytes(model), source, onnx, DecodeError)
    elif not isinstance(model, onnx.ModelProto):
        raise ModelFormatError(f"cannot load a model from {type(model).__name__}; expected a path, bytes or ModelProto")

    if not model.HasField("graph"):
        raise ModelFormatError(f"{source}: the model has no graph")
    if model.functions:
        try:
            from onnx import inliner

            model = inliner.inline_local_functions(model)
        except Exception as exc:
            raise ModelFormatError(f"{source}: model-local functions could not be inlined: {exc}") from exc
    opsets = {_domain(o.domain): int(o.version) for o in model.opset_import}
    if "" not in opsets:
        opsets[""] = 1 if model.opset_import else 21
    reader = _Reader(source, base_dir, opsets)
    return reader.graph(model.graph, outer=frozenset())


def _parse(data: bytes, source: str, onnx: Any, decode_error: type[Exception]) -> Any:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (decode_error, ValueError, RuntimeError) as exc:
        raise ModelFormatError(f"{source} is not a valid ONNX model (protobuf parse failed: {exc})") from exc
    if not model.HasField("graph") and not model.opset_import:
        raise ModelFormatError(f"{source} is not a valid ONNX model (no graph and no opset_import)")
    return model


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


class _Reader:
    def __init__(self, source: str, base_dir: Path | None, opsets: dict[str, int]) -> None:
        self.source = source
        self.base_dir = base_dir
        self.opsets = opsets
        self._onnx_schemas: dict[tuple[str, str, int], Any] = {}  # ONNX's own schema of each op, per opset

    def fail(self, message: str) -> ModelFormatError:
        return ModelFormatError(f"{self.source}: {message}")

    def graph(self, proto: Any, outer: frozenset[str], depth: int = 0) -> Graph:
        graph = Graph(name=proto.name or "main", opsets=dict(self.opsets), outer_scope=outer)
        for tensor in proto.initializer:
            if not tensor.name:
                raise self.fail("an initializer has no name")
            graph.initializers[tensor.name] = self.tensor(tensor, f"initializer {tensor.name!r}")
        if len(proto.sparse_initializer):
            raise self.fail(f"sparse initializers ({proto.sparse_initializer[0].values.name!r}) are not supported")
        for vi in proto.input:
            if vi.name in graph.initializers:
                continue  # old IR versions list initializers among the inputs
            graph.inputs.append(vi.name)
            if outer and vi.type.WhichOneof("value") is None:
                continue  # subgraph inputs may leave their type to the enclosing op (Loop/Scan bodies)
            graph.values[vi.name] = self.value_info(vi, "input")
            _keep_dim_names(graph, vi)
        if not outer:
            graph.zipmaps = self.zipmaps(proto)
        for vi in proto.output:
            graph.outputs.append(vi.name)
            if vi.name in graph.zipmaps:
                continue  # seq(map(label, float)): the Session builds it (see zipmaps)
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                graph.values.setdefault(vi.name, self.value_info(vi, "output"))
                _keep_dim_names(graph, vi)
        produced: set[str] = set()
        scope = outer | set(graph.inputs) | set(graph.initializers)
        for index, proto_node in enumerate(proto.node):
            if proto_node.op_type == "ZipMap" and proto_node.output and proto_node.output[0] in graph.zipmaps:
                continue
            node = self.node(proto_node, index, lambda: frozenset(scope | produced), depth)
            for out in node.outputs:
                if out and (out in produced or out in graph.initializers or out in graph.inputs):
                    raise self.fail(f"value {out!r} is defined twice (again by {node.label()})")
                produced.add(out)
            graph.nodes.append(node)
        graph.toposort()
        graph.validate_outputs()
        return graph

    def zipmaps(self, proto: Any) -> dict[str, tuple[str, list[Any]]]:
        """The graph's ai.onnx.ml ZipMap nodes, every scikit-learn classifier's last node as skl2onnx and
        onnxmltools export it by default: output name -> (its [N, C] probabilities input, the class labels). Hetero
        has no sequence or map values, so it runs one only as a graph output that no node reads: the Session then
        builds onnxruntime's list of N dicts {label: float} from the probabilities. Anywhere else it is refused."""
        found: dict[str, tuple[str, list[Any]]] = {}
        outputs = {vi.name for vi in proto.output}
        read = {name for node in proto.node for name in node.input}
        for index, node in enumerate(proto.node):
            if node.op_type != "ZipMap" or _domain(node.domain) != "ai.onnx.ml":
                continue
            name = node.name or f"ZipMap_{index}"
            if len(node.input) != 1 or len(node.output) != 1 or not node.input[0]:
                raise self.fail(f"node {name!r} (ZipMap) needs one input and one output")
            out = node.output[0]
            if out not in outputs or out in read:
                raise self.fail(f"node {name!r} (ZipMap) is supported only as a graph output that no node reads "
                                f"(hetero has no sequence or map values); {out!r} is "
                                + ("read by another node" if out in read else "not a graph output"))
            attrs = {a.name: a for a in node.attribute}
            if "classlabels_int64s" in attrs and len(attrs["classlabels_int64s"].ints):
                labels: list[Any] = [int(v) for v in attrs["classlabels_int64s"].ints]
            elif "classlabels_strings" in attrs and len(attrs["classlabels_strings"].strings):
                labels = [v.decode("utf-8", errors="replace") for v in attrs["classlabels_strings"].strings]
            else:
                raise self.fail(f"node {name!r} (ZipMap) has neither classlabels_int64s nor classlabels_strings")
            found[out] = (node.input[0], labels)
        return found

    def node(self, proto: Any, index: int, scope: Callable[[], frozenset[str]], depth: int) -> Node:
        """``scope()``: the names visible to the node's subgraphs (made only for a node that has any: building it
        for every node made loading quadratic in the node count)."""
        domain = _domain(proto.domain)
        name = proto.name or f"{proto.op_type}_{index}"
        node = Node(proto.op_type, list(proto.input), list(proto.output), {}, name, domain)
        while node.inputs and node.inputs[-1] == "":
            node.inputs.pop()
        if registry.find(domain, proto.op_type) is None:
            raise UnsupportedOp(
                f"{self.source}: node {name!r} uses op {domain or 'ai.onnx'}::{proto.op_type}, which hetero does "
                "not know",
                hint="a plugin can add ops through the hetero_register_ops hook",
            )
        visible: frozenset[str] | None = None
        for attr in proto.attribute:
            if attr.type in (attr.GRAPH, attr.GRAPHS) and visible is None:
                if depth >= MAX_SUBGRAPH_DEPTH:
                    raise self.fail(f"node {name!r} nests a subgraph {depth + 1} levels deep; hetero reads at most "
                                    f"{MAX_SUBGRAPH_DEPTH} levels of If / Loop / Scan bodies")
                visible = scope()
            node.attrs[attr.name] = self.attribute(attr, node, visible or frozenset(), depth + 1)
        self.check_signature(node, {attr.name: attr.type for attr in proto.attribute})
        return node

    def check_signature(self, node: Node, attr_types: dict[str, int]) -> None:
        """The node's required inputs and attributes are there, and its attributes of the types, as ONNX's schema of
        the op at the model's opset says (kernels, shape inference and graph passes may take them for granted: a
        Conv's ``group`` that is a graph or a string would otherwise fail deep inside a pass). Ops ONNX has no
        schema for are left alone. ``attr_types``: each attribute's ``AttributeProto`` type, as stored."""
        opset = self.opsets.get(node.domain, 1)
        key = (node.domain, node.op_type, opset)
        if key not in self._onnx_schemas:
            from onnx import defs

            try:
                self._onnx_schemas[key] = defs.get_schema(node.op_type, opset, node.domain)
            except defs.SchemaError:
                self._onnx_schemas[key] = None
        schema = self._onnx_schemas[key]
        if schema is None:
            return
        single = schema.inputs[0].option.Single if len(schema.inputs) else None
        for i, formal in enumerate(schema.inputs[:schema.min_input]):
            if formal.option == single and (i >= len(node.inputs) or not node.inputs[i]):
                raise self.fail(f"node {node.name!r} ({node.op_type}) lacks its required input {i} ({formal.name})")
        if len(node.inputs) < schema.min_input:
            raise self.fail(f"node {node.name!r} ({node.op_type}) has {len(node.inputs)} inputs; opset {opset} "
                            f"requires at least {schema.min_input}")
        for name, attr in schema.attributes.items():
            if attr.required and name not in node.attrs:
                raise self.fail(f"node {node.name!r} ({node.op_type}) lacks its required attribute {name!r}")
            stored = attr_types.get(name)
            if stored is not None and int(attr.type) != 0 and stored != int(attr.type):  # 0: UNDEFINED (any type)
                raise self.fail(f"node {node.name!r} ({node.op_type}): attribute {name!r} is {_attr_type(stored)}; "
                                f"ONNX's schema declares {_attr_type(int(attr.type))}")

    def attribute(self, attr: Any, node: Node, scope: frozenset[str], depth: int) -> Any:
        from onnx import AttributeProto as A

        where = f"attribute {attr.name!r} of node {node.name!r}"
        kind = attr.type
        if kind == A.FLOAT:
            return float(attr.f)
        if kind == A.INT:
            return int(attr.i)
        if kind == A.STRING:
            return attr.s.decode("utf-8", errors="replace")
        if kind == A.TENSOR:
            return self.tensor(attr.t, where)
        if kind == A.GRAPH:
            return self.graph(attr.g, scope, depth)
        if kind == A.FLOATS:  # list() of a repeated field already gives Python floats / ints, ~3x faster than a
            return list(attr.floats)  # comprehension on a tree ensemble's millions of node attributes
        if kind == A.INTS:
            return list(attr.ints)
        if kind == A.STRINGS:
            return [s.decode("utf-8", errors="replace") for s in attr.strings]
        if kind == A.TENSORS:
            return [self.tensor(t, where) for t in attr.tensors]
        if kind == A.GRAPHS:
            return [self.graph(g, scope, depth) for g in attr.graphs]
        if kind == A.TYPE_PROTO:
            return attr.tp
        if kind == A.SPARSE_TENSOR:
            raise self.fail(f"{where}: sparse tensors are not supported")
        raise self.fail(f"{where} has unknown type {kind}")

    def value_info(self, vi: Any, what: str) -> TensorInfo:
        if not vi.type.HasField("tensor_type"):
            raise self.fail(f"graph {what} {vi.name!r} is not a tensor (sequences, maps and optionals are unsupported)")
        tt = vi.type.tensor_type
        dtype = self.dtype(tt.elem_type, f"graph {what} {vi.name!r}")
        if not tt.HasField("shape"):
            return TensorInfo(dtype, None)
        # Some exporters (old paddle2onnx) write -1 for a dynamic size: it means unknown, as a dim_param would.
        dims = tuple(int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else None for d in tt.shape.dim)
        return TensorInfo(dtype, dims)

    def dtype(self, code: int, where: str) -> dtypes.DType:
        try:
            return dtypes.from_onnx(int(code))
        except HeteroError:
            raise self.fail(f"{where} has element type {code}, which hetero does not support") from None

    def tensor(self, proto: Any, where: str) -> np.ndarray:
        from onnx import TensorProto, numpy_helper

        dtype = self.dtype(proto.data_type, where)
        dims = [int(d) for d in proto.dims]
        if any(d < 0 for d in dims):
            raise self.fail(f"{where} has a negative dimension {dims}")
        if proto.data_location == TensorProto.EXTERNAL:
            return self.external(proto, dtype, dims, where)
        try:
            array = numpy_helper.to_array(proto)
        except Exception as exc:
            raise self.fail(f"{where} could not be decoded ({dtype}{dims}): {exc}") from exc
        return array

    def external(self, proto: Any, dtype: dtypes.DType, dims: list[int], where: str) -> np.ndarray:
        info = {e.key: e.value for e in proto.external_data}
        location = info.get("location")
        if not location:
            raise self.fail(f"{where} has external data without a location")
        if self.base_dir is None:
            raise self.fail(f"{where} uses external data {location!r}, which needs the model loaded from a path")
        if "\0" in location:
            raise self.fail(f"{where}: external data location {location!r} holds a NUL character")
        path = (self.base_dir / location).resolve()
        if os.path.isabs(location) or not path.is_relative_to(self.base_dir):
            raise self.fail(
                f"{where} points at external data {location!r}, outside the model's folder {str(self.base_dir)!r}"
            )
        if not path.is_file():
            raise self.fail(f"{where}: external data file {location!r} does not exist")
        if dtype.np_dtype is None or dtype is dtypes.string:
            raise self.fail(f"{where}: external data of type {dtype} is not supported")
        try:
            offset = int(info.get("offset", 0))
            numel = math.prod(dims)  # Python ints: dims that overflow int64 must not wrap into a small size
            nbytes = numel * dtype.itemsize
            length = int(info.get("length", nbytes))
        except ValueError as exc:
            raise self.fail(f"{where}: bad external data offset/length: {exc}") from exc
        size = path.stat().st_size
        if offset < 0 or length != nbytes or offset + nbytes > size:
            raise self.fail(
                f"{where}: external data {location!r} holds {size} bytes; offset {offset} + {nbytes} bytes for "
                f"{dtype}{dims} (length field {length}) does not fit"
            )
        if nbytes == 0:
            return np.zeros(dims, dtype=dtype.np_dtype)
        # Read, not memory-mapped: a mapped file truncated while the model is alive kills the process with SIGBUS at
        # the next access to a page past the new end, which no Python code can catch (the fault is avoided, not
        # caught). The cost: the weights live in process memory rather than in the page cache.
        with path.open("rb") as f:
            f.seek(offset)
            array = np.empty(numel, dtype=dtype.np_dtype)
            got = f.readinto(array.view(np.uint8))
        if got != nbytes:
            raise self.fail(f"{where}: external data {location!r} ended after {got} of {nbytes} bytes (the file "
                            "changed while it was read)")
        return array.reshape(dims)


def _keep_dim_names(graph: Graph, vi: Any) -> None:
    """Symbolic dims ("batch") of a graph input or output, for ``Session.get_inputs()``."""
    tt = vi.type.tensor_type
    if tt.HasField("shape") and any(d.dim_param for d in tt.shape.dim):
        graph.dim_names[vi.name] = tuple(d.dim_param or None for d in tt.shape.dim)


def _attr_type(kind: int) -> str:
    """An ``AttributeProto`` type's name (INT, GRAPH, ...), or its number where it names none."""
    from onnx import AttributeProto

    try:
        return AttributeProto.AttributeType.Name(kind)
    except ValueError:
        return f"type {kind}"
