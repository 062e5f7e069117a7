"""The Metal kernel table: (domain, op) -> kernel class. One module per group of ops; their .metal sources are in
``hetero_metal/msl``."""

from __future__ import annotations

from . import conv, elementwise, llm, nn

KERNELS = {**elementwise.KERNELS, **nn.KERNELS, **conv.KERNELS, **llm.KERNELS}
