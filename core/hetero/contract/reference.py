"""Every op's numpy reference, as a kernel any backend may run: the reference backend runs nothing else, and a
backend uses it for the ops (or op configurations) its own kernels leave out, keeping the model in one place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import registry
from .backend import SUPPORTED, Backend, NodeInfo, SubgraphRunner, Support, unsupported
from .errors import BackendError
from .registry import OpContext
from .tensor import Tensor, TensorInfo


def reference_supports(node: NodeInfo) -> Support:
    """Whether ``ReferenceKernel`` runs ``node``: its op has a schema and its tensors have numpy dtypes."""
    if registry.find(node.domain, node.op_type) is None:
        return unsupported(f"no schema for {node.op_type}")
    if any(i is not None and i.dtype.np_dtype is None for i in [*node.inputs, *node.outputs]):
        return unsupported("the reference computes on numpy dtypes only")
    return SUPPORTED


class ReferenceKernel:
    """The op's numpy reference on host tensors. A ``KernelFactory``: ``ReferenceKernel(node, backend)``."""

    implementation = "numpy"  # reported in session.explain() and `hetero ops` (other backends reuse this kernel)
    # computes from its inputs' values at each run (prepare keeps nothing) and raises on results of other shapes
    # than its outputs': a replay may feed it values that change from run to run (KernelProgram._guardable)
    values_at_run = True

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        self.node = node.node
        self.opset = node.opset
        self.schema = registry.get(node.domain, node.op_type)
        self.state: dict[str, Any] | None = {} if self.schema.stateful else None

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        pass

    def _compute(self, inputs: Sequence[Tensor | None], run_subgraph: SubgraphRunner | None) -> list[np.ndarray]:
        values = [None if t is None else t.numpy() for t in inputs]
        infos = [None if t is None else t.info for t in inputs]
        return self.schema.reference(OpContext(self.node, infos, values, self.opset, run_subgraph, self.state))

    def run_dynamic(self, inputs: Sequence[Tensor | None], run_subgraph: SubgraphRunner | None = None) -> list[Tensor]:
        """For data-dependent ops (NonZero, If, Loop...): compute, and let the results' shapes be the outputs'."""
        # Copies: a result may alias an input (an If branch returning an outer value), whose memory the session
        # may reuse once that input is dead.
        return [Tensor.from_numpy(np.array(r, copy=True)) for r in self._compute(inputs, run_subgraph)]

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor],
            run_subgraph: SubgraphRunner | None = None) -> None:
        results = self._compute(inputs, run_subgraph)
        for out, result in zip(outputs, results, strict=False):
            result = np.asarray(result)
            if result.shape != out.shape:
                raise BackendError(
                    f"{self.node.label()}: reference result has shape {list(result.shape)} but shape inference "
                    f"said {list(out.shape)} (a bug in the {self.node.op_type} schema)"
                )
            np.copyto(out.buffer, result, casting="unsafe")
