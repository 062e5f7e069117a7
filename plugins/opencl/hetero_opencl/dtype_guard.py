"""Every opencl kernel runs on the dtypes its tensors really have, never on a load-time guess.

A kernel picks its OpenCL variant (``copy_nd_uint``, ``gather_ushort_long``, float32 arithmetic...) from the node's
static types when it is made. Those types can be a guess: the outputs of an ``If`` or ``Scan`` whose branches /
body declare no type load as ``float32[?]``, and the real dtype shows only when the node runs. A variant for 4-byte
elements run on a float16 tensor writes past its output buffer, which on a CPU OpenCL device is the process heap.

``DtypeGuard`` sits between the session and the kernel: at ``prepare`` (which the session calls whenever an input's
shape or dtype changes) it compares the tensors' dtypes with those the kernel was built for; on a difference it asks
the kernel class again whether it takes the real dtypes and rebuilds the kernel for them, or refuses with a
``BackendError`` naming the node, the dtypes and why (as the cpu plugin's kernels refuse a dtype they do not take).
``run`` is the kernel's own bound method: no cost per run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from hetero.contract import Backend, BackendError, NodeInfo, Tensor, TensorInfo


def _dtypes(infos: Sequence[TensorInfo | Tensor | None]) -> tuple[Any, ...]:
    return tuple(None if i is None else i.dtype for i in infos)


def _names(dtypes: Sequence[Any]) -> str:
    return ", ".join("-" if d is None else str(d) for d in dtypes)


class DtypeGuard:
    """The kernel of one node, (re)built for the dtypes of the tensors it is prepared with."""

    def __init__(self, info: NodeInfo, backend: Backend, make: Callable[[NodeInfo], Any]) -> None:
        self.info = info
        self.backend = backend
        self._make = make
        self._use(info, make(info))

    def _use(self, info: NodeInfo, kernel: Any) -> None:
        self.kernel = kernel
        self.built_for = (_dtypes(info.inputs), _dtypes(info.outputs))
        self.run = kernel.run  # the session and the replay call the kernel itself: no cost per run

    def __getattr__(self, name: str) -> Any:  # implementation, bind, run_dynamic... of the kernel
        if name == "kernel":  # not built yet (during __init__)
            raise AttributeError(name)
        return getattr(self.kernel, name)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        self.check(inputs, outputs)
        self.kernel.prepare(inputs, outputs)

    def check(self, inputs: Sequence[TensorInfo | Tensor | None], outputs: Sequence[TensorInfo | Tensor]) -> None:
        """Rebuild the kernel when the tensors' dtypes differ from those it was built for, or refuse them."""
        actual = (_dtypes(inputs), _dtypes(outputs))
        if actual == self.built_for:
            return
        real = replace(self.info,
                       inputs=[None if t is None else TensorInfo(t.dtype, t.shape) for t in inputs],
                       outputs=[TensorInfo(t.dtype, t.shape) for t in outputs])
        node = self.info.node
        where = (f"opencl: node {node.name!r} ({node.op_type}) gets {_names(actual[0])} -> {_names(actual[1])} "
                 f"at run time (its types were not known when the model loaded; the kernel was chosen for "
                 f"{_names(self.built_for[0])} -> {_names(self.built_for[1])})")
        verdict = self.backend.supports(real)
        if not verdict:
            raise BackendError(f"{where}: {verdict.reason}",
                               hint="declare the value types of the If / Scan / Loop bodies in the model, or run "
                                    "this node on another backend")
        try:
            kernel = self._make(real)
        except (AttributeError, KeyError, TypeError, IndexError, ValueError) as exc:
            raise BackendError(f"{where}: the kernel cannot be built for them: {exc}") from exc
        self._use(real, kernel)
