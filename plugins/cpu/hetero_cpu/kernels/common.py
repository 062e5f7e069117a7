"""Pieces shared by the CPU kernels: dtype checks and the kernel base class."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from hetero.contract import SUPPORTED, Backend, NodeInfo, Support, Tensor, TensorInfo, dtypes, unsupported
from hetero.contract import dtype_check as backend_dtype_check
from hetero.contract.dtypes import DType
from hetero.contract.errors import HeteroError
from hetero.contract.opforms import activation_known, activation_params


def dtype_check(node: NodeInfo, allowed: Iterable[DType], indices: Sequence[int] | None = None) -> Support:
    return backend_dtype_check(node, allowed, "cpu", indices)


def float32_only(node: NodeInfo, indices: Sequence[int] | None = None) -> Support:
    return dtype_check(node, (dtypes.float32,), indices)


def bindable(*arrays: np.ndarray | None) -> bool:
    """Whether a bound call may keep these buffers as they are: a kernel's ``run`` would copy a non-contiguous
    input (``np.ascontiguousarray``) on every call, and a bound call must see the buffer's new contents instead."""
    return all(a is None or a.flags.c_contiguous for a in arrays)


Call = Callable[[], None]
Calls = Call | list[Call]  # one native call, or several (a Concat's copy per input)


def one_slot(label: str, slot: int) -> None:
    """``export_state`` / ``import_state`` of a kernel holding one sequence's state: slot 0 only."""
    if slot != 0:
        raise HeteroError(f"{label}: holds one sequence's state; slot {slot} does not exist")


def noop() -> None:
    """The bound call of a kernel with nothing to compute (an empty output)."""


class CpuKernel:
    """Base: keeps the node; ``prepare`` does nothing unless a kernel has shape-dependent plans.

    Optional ``bind(inputs, outputs) -> Callable[[], None] | None`` (used by the session's replay,
    ``hetero.runtime.replay``): a zero-argument callable that does what ``run(inputs, outputs)`` does, for these
    exact tensors, whose buffers stay while their contents change from call to call (values such as ``past_len``
    must be read at call time). Typically ``functools.partial`` of the native function, so a replayed decode step
    spends no Python per kernel. None: the replay calls ``run``. It is asked after ``prepare``, for the shapes
    prepared.
    """

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        self.info = node
        self.node = node.node
        self.backend = backend

    def attr(self, name: str, default=None):
        return self.node.attrs.get(name, default)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        pass

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        raise NotImplementedError


def weight_precision(backend: Backend) -> str | None:
    """The session's ``precision`` option for packed weights: "high" (fp32 kernels) or "normal" (bf16x3 on AMX-BF16
    where it gains); None: the process default (``HETERO_CPU_PRECISION``, else "normal")."""
    precision = backend.options.get("precision")
    return None if precision is None else str(precision)


def fused_activation(attrs: dict) -> tuple[str, float, float]:
    """The native (op, alpha, beta) of a fused node's ``activation`` attribute; ("none", 0, 0) without one."""
    return activation_params(attrs) or ("none", 0.0, 0.0)


def fused_activation_known(node: NodeInfo) -> Support:
    if activation_known(node.node.attrs):
        return SUPPORTED
    return unsupported(f"fused activation {node.attr('activation')}")


class CallKernel(CpuKernel):
    """A kernel whose work is native calls made from its tensors (``calls``): ``run`` makes and issues them, ``bind``
    hands them to the replay, which issues them with no Python of the kernel's own. ``calls`` must read the buffers
    it is given in place (views, no copies) whenever they are C-contiguous, which ``bind`` checks first; values that
    decide the calls (a Slice's starts, a Reshape's shape) are fixed per prepared signature, the replay's premise.
    """

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        raise NotImplementedError

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        made = self.calls(inputs, outputs)
        if isinstance(made, list):
            for call in made:
                call()
        else:
            made()

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        """The replay's bound call(s) (``CpuKernel.bind``)."""
        if not bindable(*(t.buffer for t in (*inputs, *outputs) if t is not None)):
            return None
        return self.calls(inputs, outputs)
