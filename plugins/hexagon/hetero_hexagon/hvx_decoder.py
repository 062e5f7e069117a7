"""``HvxDecoder``: the decode step of a dense Qwen decoder on the cDSP's HVX units, through the hetero_hvx interface
(``hvx_ops``): every linear layer is the 4-bit block product with int8 activations (``hvx_matmul_q4``, hetero q4 /
GGUF Q4_0 weights repacked at load), every norm ``hvx_rmsnorm`` and every head's rotary embedding ``hvx_rope``. A
call of up to 16 tokens (a prompt chunk, or a speculative block to verify) is one pass: each linear layer one HVX
call that reads its weights once for all the tokens, bit for bit what the tokens one at a time give. Attention over
the cache, SwiGLU and the residual adds stay on the host (vector float is what the v68 HVX integer kernels leave
out, and they are O(hidden) next to the products).

The transport is the cDSP through FastRPC where ``libcdsprpc.so`` opens (a Snapdragon), else the kernels' test
program under ``qemu-hexagon``: QEMU executes the same DSP code, so a run there is the device path's test, at
QEMU's speed (tens of milliseconds a call: for checking, never for timing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetero.contract import BackendUnavailable, HeteroError
from hetero.contract.quant import QuantFormat, dequantize, quantize

from .hvx_ops import MAX_ROWS, HvxKernels, Transport
from .layout import pad_columns, repack_q4
from .llm_graph import DecoderShape

Q4 = QuantFormat(bits=4, block_size=32, symmetric=True)


def hvx_transport() -> tuple[Transport, str]:
    """The cDSP through FastRPC when this machine has one, else qemu-hexagon (tests); BackendUnavailable naming
    both when neither is here."""
    from .cache import cache_root
    from .fastrpc import FastRpcTransport, build_skel, open_library
    from .hvx_qemu import QemuTransport, find_toolchain

    try:
        open_library()
    except BackendUnavailable as device:
        try:
            return QemuTransport(), "qemu-hexagon"
        except BackendUnavailable as qemu:
            raise BackendUnavailable(f"no HVX to run the decoder on: {device.message}; {qemu.message}",
                                     hint=qemu.hint) from None
    skel_dir = build_skel(find_toolchain(), cache_root() / "hvx" / "skel").parent
    return FastRpcTransport(skel_dir), "cDSP (FastRPC)"


class _Linear:
    """One linear layer in hetero q4, repacked for ``hvx_matmul_q4``."""

    def __init__(self, w: np.ndarray, bias: np.ndarray | None) -> None:
        self.rows, cols = w.shape
        self.packed, self.scales, self.cols = repack_q4(quantize(np.asarray(w, np.float32), Q4), cols)
        self.bias = bias

    def __call__(self, hvx: HvxKernels, x: np.ndarray) -> np.ndarray:
        """``x[m, in]`` -> ``[m, out]``: the m tokens' rows in one call, the weights read once."""
        _, _, y = hvx.matmul_q4(self.packed, self.scales, pad_columns(x, self.cols))
        return y if self.bias is None else y + self.bias


@dataclass
class _Layer:
    q: _Linear
    k: _Linear
    v: _Linear
    o: _Linear
    gate: _Linear
    up: _Linear
    down: _Linear
    in_norm: np.ndarray
    post_norm: np.ndarray
    q_norm: np.ndarray | None  # Qwen3's per-head norms
    k_norm: np.ndarray | None


class HvxDecoder:
    """A dense Qwen2 / Qwen3 decoder in hetero q4 whose steps run on HVX (``LlmDecoder``: ``run(ids, past)``)."""

    def __init__(self, shape: DecoderShape, weights: dict[str, np.ndarray], *, context: int,
                 transport: Transport | None = None, where: str = "") -> None:
        if transport is None:
            transport, where = hvx_transport()
        self.hvx, self.shape, self.context = HvxKernels(transport), shape, context
        self.name = f"hexagon (HVX on {where or 'a transport'}, q4)"
        self.note = "" if where.startswith("cDSP") else (
            "tokens per second of the HVX kernels under qemu-hexagon: an emulator's speed, not the DSP's")
        embed = np.asarray(weights["model.embed_tokens.weight"], np.float32)
        # the table holds hetero q4's values (cpu's quantized embedding); the lookup is a host copy of one row
        self.embed = dequantize(quantize(embed, Q4), Q4, embed.shape[1]).reshape(embed.shape).astype(np.float32)
        self.head = _Linear(weights.get("lm_head.weight", embed), None)
        self.final_norm = np.asarray(weights["model.norm.weight"], np.float32)
        self.layers = [self._layer(weights, f"model.layers.{i}.") for i in range(shape.layers)]
        self.k = np.zeros((shape.layers, shape.kv_heads, context, shape.head_dim), np.float32)
        self.v = np.zeros_like(self.k)
        self.length = 0
        inv = shape.rope_theta ** (-np.arange(shape.head_dim // 2) * 2 / shape.head_dim)
        self.angles = np.arange(context)[:, None] * inv  # [context, head_dim / 2]

    @staticmethod
    def _layer(w: dict[str, np.ndarray], p: str) -> _Layer:
        def linear(name: str, bias: bool = False) -> _Linear:
            return _Linear(w[f"{p}{name}.weight"], w.get(f"{p}{name}.bias") if bias else None)

        def norm(name: str) -> np.ndarray | None:
            return np.asarray(w[f"{p}{name}.weight"], np.float32) if f"{p}{name}.weight" in w else None

        return _Layer(q=linear("self_attn.q_proj", True), k=linear("self_attn.k_proj", True),
                      v=linear("self_attn.v_proj", True), o=linear("self_attn.o_proj"),
                      gate=linear("mlp.gate_proj"), up=linear("mlp.up_proj"), down=linear("mlp.down_proj"),
                      in_norm=np.asarray(w[f"{p}input_layernorm.weight"], np.float32),
                      post_norm=np.asarray(w[f"{p}post_attention_layernorm.weight"], np.float32),
                      q_norm=norm("self_attn.q_norm"), k_norm=norm("self_attn.k_norm"))

    def _heads(self, x: np.ndarray, n: int, norm: np.ndarray | None, pos: int) -> np.ndarray:
        """One token's ``x`` as ``n`` heads, each through its RMSNorm (Qwen3's q / k norms) and RoPE on HVX."""
        s = self.shape
        heads = x.reshape(n, s.head_dim)
        if norm is not None:
            heads = np.concatenate([self.hvx.rmsnorm(heads[i:i + MAX_ROWS], norm, s.eps)
                                    for i in range(0, n, MAX_ROWS)])
        cos, sin = np.cos(self.angles[pos]).astype(np.float32), np.sin(self.angles[pos]).astype(np.float32)
        return self.hvx.rope(heads, cos, sin)

    def _block(self, tokens: Sequence[int], start: int) -> np.ndarray:
        """Logits of up to MAX_ROWS tokens at positions ``start...``, in one pass: each linear layer one HVX call
        for all of them (a block of drafted tokens costs one read of the weights, as a verify step should), norms
        one call per layer, RoPE and the causal attention per token."""
        s, hvx = self.shape, self.hvx
        m = len(tokens)
        x = self.embed[np.asarray(tokens, np.int64)]  # a copy: fancy indexing
        for i, layer in enumerate(self.layers):
            h = hvx.rmsnorm(x, layer.in_norm, s.eps)
            q_rows, k_rows, v_rows = layer.q(hvx, h), layer.k(hvx, h), layer.v(hvx, h)
            q = [self._heads(q_rows[j], s.heads, layer.q_norm, start + j) for j in range(m)]
            for j in range(m):
                self.k[i, :, start + j] = self._heads(k_rows[j], s.kv_heads, layer.k_norm, start + j)
                self.v[i, :, start + j] = v_rows[j].reshape(s.kv_heads, s.head_dim)
            attended = np.stack([self._attention(q[j], i, start + j).ravel() for j in range(m)])
            x = x + layer.o(hvx, attended)
            h = hvx.rmsnorm(x, layer.post_norm, s.eps)
            gate, up = layer.gate(hvx, h), layer.up(hvx, h)
            x = x + layer.down(hvx, (gate / (1 + np.exp(-gate)) * up).astype(np.float32))
        return self.head(hvx, hvx.rmsnorm(x, self.final_norm, s.eps))

    def _attention(self, q: np.ndarray, layer: int, pos: int) -> np.ndarray:
        """Host attention of ``q[heads, head_dim]`` over the cached positions ``0..pos`` (grouped query heads)."""
        s = self.shape
        group = s.heads // s.kv_heads
        keys = np.repeat(self.k[layer, :, : pos + 1], group, axis=0)  # [heads, pos + 1, head_dim]
        values = np.repeat(self.v[layer, :, : pos + 1], group, axis=0)
        scores = np.einsum("hd,hpd->hp", q, keys) * np.float32(s.head_dim ** -0.5)
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        return np.einsum("hp,hpd->hd", weights, values).astype(np.float32)

    def run(self, ids: Sequence[int], past: int) -> np.ndarray:
        """float32 logits ``[len(ids), vocab]`` of ``ids`` after the first ``past`` cached positions."""
        if not 0 <= past <= self.length or past + len(ids) > self.context:
            raise HeteroError(f"the HVX decoder holds {self.length} of {self.context} positions; asked to run "
                              f"{len(ids)} after {past}")
        blocks = [self._block(ids[i:i + MAX_ROWS], past + i) for i in range(0, len(ids), MAX_ROWS)]
        self.length = past + len(ids)
        return np.concatenate(blocks)

    def close(self) -> None:
        """Nothing to free: the transport holds no model state between calls."""
