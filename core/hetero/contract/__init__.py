"""The backend plugin contract: everything a backend package imports from hetero, and nothing else.

``hetero.contract`` imports nothing from the runtime, the frontends or the LLM layer (a test reads its imports from
the source), so a plugin that imports only this package depends on what ``API_VERSION`` covers and nothing more:

* ``backend`` — ``Factory``, ``Device``, ``Backend``, ``KernelTableBackend``, ``HostMemory``, ``NodeInfo``,
  ``Support``, the ``Kernel`` protocol (every method the runtime may call) and, for whole-graph backends, the
  ``Segment`` a backend compiles and the ``Program`` it returns;
* ``decoder`` — for backends that run an LLM decoder whole (NPUs): the ``DecoderRequest`` ``Backend.llm_decoder``
  gets and the ``LlmDecoder`` it returns;
* ``hookspecs`` — the hooks a plugin implements (``hookimpl``);
* ``tensor``, ``dtypes``, ``graph`` — the values, element types and graph IR a backend receives;
* ``registry`` — the op schemas (``OpSchema``: shape inference and numpy reference); ``reference`` — that numpy
  reference as a kernel a backend may run for the ops it leaves out;
* ``quant`` and ``opforms`` — the block-quantized weight formats and the op attribute forms kernels read;
* ``errors`` — the error hierarchy (``BackendUnavailable`` from a probe, ``BackendError`` from a kernel...).

Read docs/backend-authors.md for a walk-through.
"""

from __future__ import annotations

from . import dtypes, graph, opforms, quant, registry
from .backend import (
    API_VERSION,
    SUPPORTED,
    Backend,
    Device,
    Factory,
    HostMemory,
    Kernel,
    KernelFactory,
    KernelTableBackend,
    NodeInfo,
    Program,
    Segment,
    SubgraphRunner,
    Support,
    dtype_check,
    unsupported,
)
from .decoder import DecoderRequest, LlmDecoder
from .errors import (
    BackendError,
    BackendUnavailable,
    FallbackError,
    HeteroError,
    HeteroWarning,
    InputError,
    ModelFormatError,
    PluginError,
    ShapeError,
    UnsupportedOp,
)
from .hookspecs import hookimpl, hookspec
from .tensor import Tensor, TensorInfo, static_shape

__all__ = [
    "API_VERSION",
    "SUPPORTED",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "DecoderRequest",
    "Device",
    "Factory",
    "FallbackError",
    "HeteroError",
    "HeteroWarning",
    "HostMemory",
    "InputError",
    "Kernel",
    "KernelFactory",
    "KernelTableBackend",
    "LlmDecoder",
    "ModelFormatError",
    "NodeInfo",
    "PluginError",
    "Program",
    "Segment",
    "ShapeError",
    "SubgraphRunner",
    "Support",
    "Tensor",
    "TensorInfo",
    "UnsupportedOp",
    "dtype_check",
    "dtypes",
    "graph",
    "hookimpl",
    "hookspec",
    "opforms",
    "quant",
    "registry",
    "static_shape",
    "unsupported",
]
