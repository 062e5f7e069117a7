"""The Metal kernel table: (domain, op) -> kernel class. One module per group of ops; their .metal sources are in
``hetero_metal/msl``."""

from __future__ import annotations

from . import conv, elementwise, gated_delta, llm, movement, nn, reduce

KERNELS = {**elementwise.KERNELS, **nn.KERNELS, **conv.KERNELS, **llm.KERNELS, **gated_delta.KERNELS,
           **movement.KERNELS, **reduce.KERNELS}
