"""LSTM on OpenCL (cl/rnn.cl): the input projections of all steps in one tiled GEMM, then the recurrence in one
launch (a work-group per batch entry and direction). Forward, reverse and bidirectional, layout 0, the default
activations; peepholes, clip, input_forget and sequence_lens stay with the cpu backend."""

from __future__ import annotations

from collections.abc import Sequence

from hetero.contract import SUPPORTED, NodeInfo, Support, Tensor, unsupported

from .common import ClKernel, float32_only, pow2_at_most
from .gemm import gemm

PROGRAM = "rnn.cl"
_DEFAULT_ACTIVATIONS = ["sigmoid", "tanh", "tanh"]
MAX_GROUP = 256


def _present(node: NodeInfo, index: int) -> bool:
    return index < len(node.node.inputs) and bool(node.node.inputs[index])


class ClLSTM(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = float32_only(node, [i for i in (0, 1, 2, 3, 5, 6) if _present(node, i)])
        if not verdict:
            return verdict
        if _present(node, 4) or _present(node, 7):
            return unsupported("LSTM with sequence_lens or peepholes")
        if node.attr("clip") is not None or int(node.attr("input_forget", 0)) or int(node.attr("layout", 0)):
            return unsupported("LSTM with clip, input_forget or layout 1")
        acts = node.attr("activations")
        if acts is not None:
            names = [a.decode() if isinstance(a, bytes) else str(a) for a in acts]
            if any(n.lower() != want for i, n in enumerate(names) for want in [_DEFAULT_ACTIVATIONS[i % 3]]):
                return unsupported(f"LSTM activations {names} (opencl: sigmoid, tanh, tanh)")
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        direction = self.attr("direction", "forward")
        direction = direction.decode() if isinstance(direction, bytes) else str(direction)
        self.reverse_mask = {"forward": 0, "reverse": 1, "bidirectional": 2}[direction]

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, w, r = inputs[0], inputs[1], inputs[2]
        assert x is not None and w is not None and r is not None
        bias = inputs[3] if len(inputs) > 3 else None
        h0 = inputs[5] if len(inputs) > 5 else None
        c0 = inputs[6] if len(inputs) > 6 else None
        t, b, feat = x.shape
        d, four_h, _ = w.shape
        h = four_h // 4
        y, yh, yc = (outputs[i] if i < len(outputs) else None for i in range(3))
        y_buf = y.buffer if y is not None else self.be.scratch("lstm-y", t * d * b * h * 4)
        yh_buf = yh.buffer if yh is not None else self.be.scratch("lstm-yh", d * b * h * 4)
        yc_buf = yc.buffer if yc is not None else self.be.scratch("lstm-yc", d * b * h * 4)
        if t * b * h == 0:
            return
        gx = self.be.scratch("lstm-gx", d * t * b * four_h * 4)
        offs = self.meta("offs", [v for di in range(d) for v in (0, di * four_h * feat)])
        gemm(self, x.buffer, w.buffer, gx, t * b, four_h, feat, (feat, 1, 1, feat), offs, d)
        size = pow2_at_most(h, MAX_GROUP)
        dummy = self.be.dummy
        self.launch(self.k(PROGRAM, "lstm_recurrence"), [b * size, d], [size, 1], gx, r.buffer,
                    dummy if bias is None else bias.buffer, dummy if h0 is None else h0.buffer,
                    dummy if c0 is None else c0.buffer, y_buf, yh_buf, yc_buf, t, b, h, d, int(bias is not None),
                    int(h0 is not None), int(c0 is not None), self.reverse_mask, self.rt.native.Local(2 * h * 4))


KERNELS = {("", "LSTM"): ClLSTM}
