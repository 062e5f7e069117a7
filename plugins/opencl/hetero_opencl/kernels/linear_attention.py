"""ONNX opset-27 ``LinearAttention`` and ``CausalConvWithState`` (hetero.ops.linear_attention) on OpenCL
(cl/linear_attention.cl), float32: the per-token recurrence with each work-item owning one value column of one KV
head's state, and the causal depthwise conv with its carried state."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hetero.contract import SUPPORTED, HeteroError, NodeInfo, Support, Tensor, unsupported

from .common import ClKernel, float32_only

PROGRAM = "linear_attention.cl"
# Rule codes: keep in sync with cl/linear_attention.cl (LA_*).
RULES = {"linear": 0, "gated": 1, "delta": 2, "gated_delta": 3}
MAX_DK = 256  # each work-item keeps a state column of d_k floats in private memory


def _text(value: object, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


class ClLinearAttention(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = float32_only(node)
        if not verdict:
            return verdict
        rule = _text(node.attr("update_rule"), "gated_delta")
        if rule not in RULES:
            return unsupported(f"LinearAttention update_rule {rule!r}")
        key, hkv = node.inputs[1], int(node.attr("kv_num_heads", 0) or 0)
        if key is not None and key.shape is not None and key.shape[2] is not None and hkv > 0:
            dk = key.shape[2] // hkv
            if not 0 < dk <= MAX_DK:
                return unsupported(f"LinearAttention with key head size {dk} (opencl: 1..{MAX_DK})")
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.rule = RULES[_text(self.attr("update_rule"), "gated_delta")]
        self.hq, self.hkv = int(self.attr("q_num_heads")), int(self.attr("kv_num_heads"))

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        q, k, v = inputs[0], inputs[1], inputs[2]
        assert q is not None and k is not None and v is not None
        past = inputs[3] if len(inputs) > 3 else None
        decay = inputs[4] if len(inputs) > 4 else None
        beta = inputs[5] if len(inputs) > 5 else None
        b, t = q.shape[0], q.shape[1]
        dk, dv = k.shape[2] // self.hkv, v.shape[2] // self.hkv
        if not 0 < dk <= MAX_DK:
            raise HeteroError(f"{self.node.label()}: key head size {dk}; opencl takes 1..{MAX_DK}")
        scale = float(self.attr("scale", 0.0) or 0.0) or 1.0 / math.sqrt(dk)
        per_key = int(decay is not None and decay.shape[-1] == self.hkv * dk)
        beta_heads = 1 if beta is None else beta.size // max(b * t, 1)
        state = outputs[1] if len(outputs) > 1 else None
        state_buf = state.buffer if state is not None else self.be.scratch("la-state", b * self.hkv * dk * dv * 4)
        if b * self.hkv * dv == 0:
            return
        dummy = self.be.dummy
        self.launch(self.k(PROGRAM, "linear_attention", (f"LA_DK={dk}",)), [dv, self.hkv, b], None, q.buffer,
                    k.buffer, v.buffer, dummy if past is None else past.buffer,
                    dummy if decay is None else decay.buffer, dummy if beta is None else beta.buffer,
                    outputs[0].buffer, state_buf, t, self.hq, self.hkv, dv, self.rule, int(past is not None),
                    per_key, beta_heads, scale)


class ClCausalConvWithState(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = float32_only(node)
        if verdict and _text(node.attr("activation"), "none") not in ("none", "silu", "swish"):
            return unsupported(f"CausalConvWithState activation {node.attr('activation')!r}")
        return verdict

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, w = inputs[0], inputs[1]
        assert x is not None and w is not None
        bias = inputs[2] if len(inputs) > 2 else None
        past = inputs[3] if len(inputs) > 3 else None
        b, c, length = x.shape
        kk = w.shape[2]
        silu = int(_text(self.attr("activation"), "none") in ("silu", "swish"))
        dummy = self.be.dummy
        past_buf = dummy if past is None else past.buffer
        if outputs[0].size:
            self.launch(self.k(PROGRAM, "causal_conv"), [length, c, b], None, x.buffer, w.buffer,
                        dummy if bias is None else bias.buffer, past_buf, outputs[0].buffer, c, length, kk,
                        int(bias is not None), int(past is not None), silu)
        if len(outputs) > 1 and outputs[1].size:
            self.launch(self.k(PROGRAM, "causal_conv_state"), [kk - 1, c, b], None, x.buffer, past_buf,
                        outputs[1].buffer, c, length, kk, int(past is not None))


KERNELS = {
    ("", "LinearAttention"): ClLinearAttention,
    ("", "CausalConvWithState"): ClCausalConvWithState,
}
