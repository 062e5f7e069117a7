"""ONNX ops (and op configurations) that the cpu backend runs with hetero's numpy reference, inside the plugin.

They keep whole models on the cpu backend (no fallback, no copies, one placement report) where a native kernel
would not pay for itself. ``hetero ops`` / ``docs/ops.md`` list which ops are native and which are numpy, and
``session.explain()`` marks each node that ran as numpy.
"""

from __future__ import annotations

from hetero.contract import registry
from hetero.contract.graph import ML_DOMAIN
from hetero.contract.reference import ReferenceKernel, reference_supports


class CpuNumpyKernel(ReferenceKernel):
    accepts = staticmethod(reference_supports)


def onnx_ops() -> dict[tuple[str, str], type[CpuNumpyKernel]]:
    """Every ONNX-domain and ai.onnx.ml op hetero has a schema for: the cpu backend never sends such a node elsewhere
    (a scikit-learn model's Scaler or LinearClassifier stays with the MatMuls around it). Native kernels replace these
    entries; a native kernel that declines a configuration (a dtype, an attribute) hands the node back to this
    kernel (CpuBackend.kernel)."""
    return {(s.domain, s.name): CpuNumpyKernel for s in registry.all_schemas() if s.domain in ("", ML_DOMAIN)}
