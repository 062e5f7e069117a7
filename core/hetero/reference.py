"""The reference backend: every op's numpy reference, on the host. It ends every fallback chain.

It is registered through the same entry point group as any third-party backend (see the core's pyproject.toml),
and it is the smallest complete example of the plugin contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from .contract import registry
from .contract.backend import (
    API_VERSION,
    SUPPORTED,
    Backend,
    Device,
    Factory,
    HostMemory,
    NodeInfo,
    Support,
    unsupported,
)
from .contract.errors import BackendError
from .contract.hookspecs import hookimpl
from .contract.registry import OpContext
from .contract.tensor import Tensor, TensorInfo

api_version = API_VERSION


class ReferenceKernel:
    implementation = "numpy"  # reported in session.explain() and `hetero ops` (other backends reuse this kernel)

    def __init__(self, node: NodeInfo) -> None:
        self.node = node.node
        self.opset = node.opset
        self.schema = registry.get(node.domain, node.op_type)
        self.state: dict[str, Any] | None = {} if self.schema.stateful else None

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        pass

    def _compute(self, inputs: Sequence[Tensor | None], run_subgraph: Any) -> list[np.ndarray]:
        values = [None if t is None else t.numpy() for t in inputs]
        infos = [None if t is None else t.info for t in inputs]
        return self.schema.reference(OpContext(self.node, infos, values, self.opset, run_subgraph, self.state))

    def run_dynamic(self, inputs: Sequence[Tensor | None], run_subgraph: Any = None) -> list[Tensor]:
        """For data-dependent ops (NonZero, If, Loop...): compute, and let the results' shapes be the outputs'."""
        # Copies: a result may alias an input (an If branch returning an outer value), whose memory the session
        # may reuse once that input is dead.
        return [Tensor.from_numpy(np.array(r, copy=True)) for r in self._compute(inputs, run_subgraph)]

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor], run_subgraph: Any = None) -> None:
        results = self._compute(inputs, run_subgraph)
        for out, result in zip(outputs, results, strict=False):
            result = np.asarray(result)
            if result.shape != out.shape:
                raise BackendError(
                    f"{self.node.label()}: reference result has shape {list(result.shape)} but shape inference "
                    f"said {list(out.shape)} (a bug in the {self.node.op_type} schema)"
                )
            np.copyto(out.buffer, result, casting="unsafe")


class ReferenceBackend(HostMemory, Backend):
    name: ClassVar[str] = "reference"

    def supports(self, node: NodeInfo) -> Support:
        if registry.find(node.domain, node.op_type) is None:
            return unsupported(f"no schema for {node.op_type}")
        if any(i is not None and i.dtype.np_dtype is None for i in [*node.inputs, *node.outputs]):
            return unsupported("the reference computes on numpy dtypes only")
        return SUPPORTED

    def kernel(self, node: NodeInfo) -> ReferenceKernel:
        return ReferenceKernel(node)


class ReferenceFactory(Factory):
    name: ClassVar[str] = "reference"
    priority: ClassVar[int] = 100

    def probe(self) -> list[Device]:
        return [Device("numpy", kind="cpu", vendor="numpy " + np.__version__)]

    def create(self, device: Device, options: dict[str, Any] | None = None) -> ReferenceBackend:
        return ReferenceBackend(device, options)


@hookimpl
def hetero_register_backends(register) -> None:
    register(ReferenceFactory())
