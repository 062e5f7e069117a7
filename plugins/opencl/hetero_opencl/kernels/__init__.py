"""The OpenCL kernel table: (domain, op) -> kernel class. One module per kernel family, one .cl program each."""

from __future__ import annotations

from . import convert, elementwise, gated_delta, linear_attention, llm, movement, nn, reduce, rnn

KERNELS = {
    **elementwise.KERNELS,
    **movement.KERNELS,
    **nn.KERNELS,
    **llm.KERNELS,
    **gated_delta.KERNELS,
    **convert.KERNELS,
    **reduce.KERNELS,
    **linear_attention.KERNELS,
    **rnn.KERNELS,
}
