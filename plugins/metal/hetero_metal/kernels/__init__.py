"""The Metal kernel table: (domain, op) -> kernel class. One module per group of ops; their .metal sources are in
``hetero_metal/msl``."""

from __future__ import annotations

from . import elementwise, llm, nn

KERNELS = {**elementwise.KERNELS, **nn.KERNELS, **llm.KERNELS}
