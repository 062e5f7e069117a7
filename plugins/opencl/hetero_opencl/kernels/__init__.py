"""The OpenCL kernel table: (domain, op) -> kernel class. One module per kernel family, one .cl program each."""

from __future__ import annotations

from . import elementwise, gated_delta, llm, movement, nn

KERNELS = {
    **elementwise.KERNELS,
    **movement.KERNELS,
    **nn.KERNELS,
    **llm.KERNELS,
    **gated_delta.KERNELS,
}
