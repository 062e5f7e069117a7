"""The LLM decoder ops (domain ``hetero``) on OpenCL: Embedding, RMSNorm, RotaryEmbedding, Attention with its KV
cache in device buffers, QMatMul (matrix-vector kernel for decode, dequantize + tiled GEMM for prefill) and MoE
(routing, expert MLPs and the weighted sum all on the device). Weight formats: f32, f16, bf16, q8, q4 (cl/weights.cl,
one program per format)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hetero.contract import SUPPORTED, HeteroError, NodeInfo, Support, Tensor, dtypes, quant, unsupported
from hetero.contract.opforms import cache_range_error, one_sequence, rope_inv_freq

from .common import ClKernel, float32_only, pow2_at_most
from .gemm import gemm

WEIGHTS = "weights.cl"
LLM = "llm.cl"
MATVEC_MAX_ROWS = 8  # up to this many tokens use the matrix-vector kernel; more dequantize once and run the GEMM
_FLOAT_CODES = {"f32": 0, "f16": 1, "bf16": 2}


def weight_format(attrs: dict) -> tuple[tuple[str, ...], quant.QuantFormat | None, int]:
    """(build defines, block format or None, bytes per element for float weights) of a node's weight attributes."""
    wtype = attrs.get("wtype", "f32")
    fmt = quant.format_from_attrs(wtype, int(attrs.get("block_size", 32)), int(attrs.get("symmetric", 1)))
    if fmt is None:
        return (f"WFMT={_FLOAT_CODES[wtype]}",), None, 4 if wtype == "f32" else 2
    code = (3 if fmt.bits == 8 else 5) + (0 if fmt.symmetric else 1)
    return (f"WFMT={code}", f"WBLOCK={fmt.block_size}", f"WBB={fmt.block_bytes}", f"WHDR={fmt.header_bytes}"), fmt, 0


def row_bytes(fmt: quant.QuantFormat | None, element_bytes: int, k: int) -> int:
    return fmt.row_bytes(k) if fmt is not None else element_bytes * k


def _known_wtype(node: NodeInfo) -> Support:
    try:
        weight_format(node.node.attrs)
    except (HeteroError, KeyError):
        return unsupported(f"weight type {node.attr('wtype')!r}")
    return SUPPORTED


class _WeightKernel(ClKernel):
    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.defines, self.fmt, self.elem = weight_format(self.node.attrs)
        self.local = self.rt.native.Local

    def wk(self, name: str):
        return self.k(WEIGHTS, name, self.defines)

    def tuned_lws(self, key: str, trial) -> int:
        return self.rt.tuned(f"{key}|{','.join(self.defines)}", [0, 32, 64, 128, 256], trial, 64)


class ClEmbedding(_WeightKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return _known_wtype(node)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        ids, table, y = inputs[0], inputs[1], outputs[0]
        assert ids is not None and table is not None
        vocab = table.shape[0]
        if ids.host_copy is not None and ids.size:  # ids came from the host: check them there, for free
            values = ids.host_copy
            if values.min() < 0 or values.max() >= vocab:
                bad = int(values[(values < 0) | (values >= vocab)].reshape(-1)[0])
                raise HeteroError(f"{self.node.label()}: token id {bad} is outside the vocabulary [0, {vocab})")
        dim = y.shape[-1]
        kind = "long" if ids.dtype == dtypes.int64 else "int"
        self.launch(self.wk(f"embedding_{kind}"), [-(-dim // 16), ids.size], None, ids.buffer, table.buffer,
                    y.buffer, dim, row_bytes(self.fmt, self.elem, dim), vocab)


class ClQMatMul(_WeightKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if len(node.outputs) > 1:
            return unsupported("QMatMul with its rows' argmax (a second output)")
        verdict = _known_wtype(node)
        return float32_only(node, [0]) if verdict else verdict

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.lws: dict[int, int] = {}

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, w, y = inputs[0], inputs[1], outputs[0]
        assert x is not None and w is not None
        bias = inputs[2] if len(inputs) > 2 else None
        k = x.shape[-1]
        n = w.shape[0]
        m = x.size // k if k else 0
        rb = row_bytes(self.fmt, self.elem, k)
        if m == 0 or n == 0:
            return
        bias_buf = self.be.dummy if bias is None else bias.buffer
        if m <= MATVEC_MAX_ROWS:
            split, rows = self.wk("qmatvec"), self.wk("qmatvec_rows")
            groups = -(-m // 4)

            def launch(lws: int) -> None:  # lws 0: the one-row-per-work-item kernel, else split-K with lws items
                if lws == 0:
                    self.launch(rows, [n, groups], None, x.buffer, w.buffer, bias_buf, y.buffer, m, n, k, rb,
                                int(bias is not None))
                else:
                    self.launch(split, [lws, n, groups], [lws, 1, 1], x.buffer, w.buffer, bias_buf, y.buffer, m, n,
                                k, rb, int(bias is not None), self.local(lws * 4 * 4))

            lws = self.lws.get(k)
            if lws is None:
                lws = self.lws[k] = self.tuned_lws(f"qmatvec|k{pow2_at_most(max(k, 1), 1 << 20)}", launch)
            launch(lws)
            return
        dense = self.be.scratch("dequant", n * k * 4)
        self.launch(self.wk("dequant"), [-(-k // 16), n], None, w.buffer, dense, n, k, rb)
        gemm(self, x.buffer, dense, y.buffer, m, n, k, (k, 1, 1, k), self.meta("offs", (0, 0)),
             bias=None if bias is None else bias.buffer, bias_strides=(0, 0, 1))


class ClRMSNorm(ClKernel):
    accepts = staticmethod(float32_only)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, w, y = inputs[0], inputs[1], outputs[0]
        d = x.shape[-1]
        rows = x.size // d if d else 0
        size = pow2_at_most(max(d, 1), 256)
        self.launch(self.k(LLM, "rmsnorm"), [rows * size], [size], x.buffer, w.buffer, y.buffer, d,
                    float(self.attr("epsilon", 1e-6)), float(self.attr("offset", 0.0)),
                    self.rt.native.Local(size * 4))


def _past_len(kernel: ClKernel, tensor: Tensor | None) -> int:
    return int(np.asarray(kernel.host(tensor)).reshape(-1)[0])


class ClRotary(ClKernel):
    """The cos/sin table is computed on the host in float64 (as the reference does) and grows by doubling."""

    accepts = staticmethod(lambda node: one_sequence(node) and float32_only(node, [0]))

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.table = None
        self.capacity = 0
        self.rot = 0

    def _table(self, needed: int, rot: int):
        if self.table is None or needed > self.capacity or rot != self.rot:
            cap = max(256, 1 << (needed - 1).bit_length())
            inv_freq, scale = rope_inv_freq(rot, self.node.attrs)
            angles = np.arange(cap, dtype=np.float64)[:, None] * inv_freq[None, :]
            table = np.stack([np.cos(angles) * scale, np.sin(angles) * scale], axis=1).astype(np.float32)
            self.table = self.be.upload(table, kind="weights").buffer
            self.capacity, self.rot = cap, rot
        return self.table

    def _rot(self, x: Tensor) -> int:
        d = x.shape[2]
        rot = int(self.attr("rotary_dim", 0)) or d
        if rot % 2 or rot > d:
            raise HeteroError(f"{self.node.label()}: rotary_dim {rot} must be even and at most head_dim {d}")
        return rot

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x = inputs[0]
        assert x is not None
        self._table(_past_len(self, inputs[1]) + x.shape[0], self._rot(x))
        self.device_work(inputs, outputs)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Any:
        """Bound once the table holds every position the session's KV caches can (``be.max_positions``)."""
        if self.be.max_positions is None or inputs[0] is None:
            return None
        self._table(self.be.max_positions, self._rot(inputs[0]))
        return super().bind(inputs, outputs)

    def device_work(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, past, y = inputs[0], inputs[1], outputs[0]
        assert x is not None and past is not None
        t, h, d = x.shape
        self.launch(self.k(LLM, "rope"), [d, h, t], None, x.buffer, y.buffer, self.table, h, d, self._rot(x),
                    past.buffer, self.capacity)


ATT_WG = 64


class ClAttention(ClKernel):
    """Causal GQA over this node's KV cache, two device buffers [Hkv, max_context, D] allocated at the first run."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = one_sequence(node) and float32_only(node, [0, 1, 2])
        if verdict and str(node.attr("kv_dtype", "f16")) not in ("f16", "f32"):
            return unsupported(f"Attention with kv_dtype {node.attr('kv_dtype')!r}")
        q = node.inputs[0]
        if verdict and q is not None and q.shape is not None and isinstance(q.shape[-1], int) \
                and q.shape[-1] > 8 * ATT_WG:
            return unsupported(f"head_dim {q.shape[-1]} above {8 * ATT_WG}")
        return verdict

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.max_context = int(self.attr("max_context"))
        kv_dtype = str(self.attr("kv_dtype", "f16"))
        self.defines = ("KV_HALF",) if kv_dtype == "f16" else ()  # the op's semantics: round k/v to float16
        self.kv_bytes = 2 if kv_dtype == "f16" else 4
        self.cache: tuple[object, object] | None = None
        self.cache_shape: tuple[int, int] | None = None
        self.filled = 0
        # Once a replay has bound it, steps it runs unseen by the host move the positions (a program keeps a
        # replay per step size): the host check stays off from then on.
        self.bound = False
        backend.max_positions = max(backend.max_positions or 0, self.max_context)  # what ClRotary's table holds

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        q, k = inputs[0], inputs[1]
        assert q is not None and k is not None
        t, _, d = q.shape
        hkv = k.shape[1]
        past = _past_len(self, inputs[3])
        error = cache_range_error(self.node.label(), past, t, self.filled, self.max_context)
        if error is not None:
            raise error
        if self.cache is None or self.cache_shape != (hkv, d):
            nbytes = hkv * self.max_context * d * self.kv_bytes
            self.cache = (self.be.alloc(nbytes, "weights"), self.be.alloc(nbytes, "weights"))
            self.cache_shape = (hkv, d)
        self.device_work(inputs, outputs)
        if not self.bound:
            self.filled = past + t

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Any:
        """The store reads past_len on the device and the attention from past_len's host copy at each launch (the
        replay refills it in place), so the replay re-issues both as they are; the host no longer sees the positions
        (Llm.forward checks the context), so the filled-positions check stops."""
        past = inputs[3]
        if past is None or past.host_copy is None or past.host_copy.dtype != np.int64:
            return None
        calls = super().bind(inputs, outputs)
        if calls is not None:
            self.filled, self.bound = self.max_context, True
        return calls

    def device_work(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        q, k, v, past, y = inputs[0], inputs[1], inputs[2], inputs[3], outputs[0]
        assert q is not None and k is not None and v is not None and past is not None and self.cache is not None
        t, hq, d = q.shape
        hkv = k.shape[1]
        kc, vc = self.cache
        self.launch(self.k(LLM, "kv_store", self.defines), [d, hkv, t], None, k.buffer, v.buffer, kc, vc, hkv, d,
                    self.max_context, past.buffer)
        scale = float(self.attr("scale", 0.0)) or 1.0 / math.sqrt(d)
        # recorded for the replay: the host copy itself (read at each launch); run: the value
        position = past.host_copy if self.recording else _past_len(self, past)
        self.launch(self.k(LLM, "attention", self.defines), [ATT_WG, hq, t], [ATT_WG, 1, 1], q.buffer, kc, vc,
                    y.buffer, hq, hkv, d, self.max_context, position, scale)


class ClMoE(_WeightKernel):
    """Routing, expert MLPs and the weighted sum on the device: no host round trip for the chosen experts."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if any(i < len(node.inputs) and node.inputs[i] is not None for i in range(5, 9)):
            return unsupported("MoE with a shared expert (inputs 5-8; the opencl kernel routes experts only)")
        verdict = _known_wtype(node)
        return float32_only(node, [0, 1]) if verdict else verdict

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, router, gate, up_w, down, y = (*inputs[:5], outputs[0])
        assert x is not None and router is not None and gate is not None and up_w is not None and down is not None
        t, hidden = x.shape
        experts, inter = gate.shape[0], gate.shape[1]
        top_k = int(self.attr("top_k"))
        if t == 0:
            return
        be = self.be
        logits = be.scratch("moe_logits", t * experts * 4)
        gemm(self, x.buffer, router.buffer, logits, t, experts, hidden, (hidden, 1, 1, hidden),
             self.meta("offs", (0, 0)))
        chosen = be.scratch("moe_chosen", t * top_k * 4)
        weights = be.scratch("moe_weights", t * top_k * 4)
        self.launch(self.k(LLM, "moe_route"), [t], None, logits, chosen, weights, t, experts, top_k,
                    int(self.attr("norm_topk_prob", 1)))
        rows = t * top_k
        h = be.scratch("moe_h", rows * inter * 4)
        part = be.scratch("moe_part", rows * hidden * 4)
        lws = 64
        self.launch(self.wk("moe_gate_up"), [lws, inter, rows], [lws, 1, 1], x.buffer, chosen, gate.buffer,
                    up_w.buffer, h, top_k, inter, hidden, row_bytes(self.fmt, self.elem, hidden), self.local(lws * 4))
        self.launch(self.wk("moe_down"), [lws, hidden, rows], [lws, 1, 1], h, chosen, down.buffer, part, top_k,
                    hidden, inter, row_bytes(self.fmt, self.elem, inter), self.local(lws * 4))
        self.launch(self.k(LLM, "moe_combine"), [hidden, t], None, part, weights, y.buffer, hidden, top_k)


KERNELS = {
    ("hetero", "Embedding"): ClEmbedding,
    ("hetero", "QMatMul"): ClQMatMul,
    ("hetero", "RMSNorm"): ClRMSNorm,
    ("hetero", "RotaryEmbedding"): ClRotary,
    ("hetero", "Attention"): ClAttention,
    ("hetero", "MoE"): ClMoE,
}
