"""Synthetic models: real shapes, deterministic random weights, already block-quantized (no download, no file).

The quantized blocks are drawn directly (random quants, a fixed scale per block chosen so each weight has a
standard deviation near 1/sqrt(fan-in)), so building the 0.6B-parameter model takes seconds.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..contract.errors import HeteroError
from ..contract.quant import QuantFormat, parse_quant
from .config import LlmConfig, RopeConfig
from .families import build_graph
from .model import Llm
from .weights import Weight, WeightSource

# Keyword arguments of LlmConfig (Any: mypy checks a ** splat against every parameter's type).
SHAPES: dict[str, dict[str, Any]] = {
    # Qwen3-0.6B: 28 layers, 16 query / 8 key-value heads of 128, tied embeddings.
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                       num_kv_heads=8, head_dim=128),
    # A few layers of the same structure, for tests.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=16),
}
LABELS = {"qwen3-0.6b": "0.6B", "tiny": "tiny", "qwen3.5-0.8b": "0.8B", "qwen3.5-2b": "2B", "qwen3.5-tiny": "tiny"}

# Qwen3.5 (hybrid: 3 Gated DeltaNet layers then one gated full-attention layer, repeated; tied embeddings).
_QWEN35_LINEAR = dict(linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
                      linear_value_head_dim=128, linear_conv_kernel_dim=4)
HYBRID_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3.5-0.8b": dict(vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_layers=24, num_heads=8,
                         num_kv_heads=2, head_dim=256, **_QWEN35_LINEAR),
    "qwen3.5-2b": dict(vocab_size=248320, hidden_size=2048, intermediate_size=6144, num_layers=24, num_heads=8,
                       num_kv_heads=2, head_dim=256, **_QWEN35_LINEAR),
    "qwen3.5-tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                         num_kv_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                         linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4),
}


def synthetic_config(size: str = "qwen3-0.6b") -> LlmConfig:
    if size in HYBRID_SHAPES:
        shape = dict(HYBRID_SHAPES[size])
        layers = shape["num_layers"]
        return LlmConfig(
            family="qwen3_5", rms_norm_eps=1e-6, rope=RopeConfig(theta=10_000_000.0, rotary_dim=shape["head_dim"] // 4),
            max_position_embeddings=262144, tie_word_embeddings=True, qkv_bias=False, o_bias=False, qk_norm=True,
            torch_dtype="bfloat16", eos_token_ids=(), attn_output_gate=True, norm_offset=1.0,
            layer_types=tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)),
            **shape,
        )
    if size not in SHAPES:
        known = sorted(SHAPES) + sorted(HYBRID_SHAPES)
        raise HeteroError(f"synthetic model {size!r} is unknown; expected one of {known}")
    return LlmConfig(
        family="qwen3", rms_norm_eps=1e-6, rope=RopeConfig(theta=1_000_000.0), max_position_embeddings=40960,
        tie_word_embeddings=True, qkv_bias=False, o_bias=False, qk_norm=True, torch_dtype="bfloat16",
        eos_token_ids=(), **SHAPES[size],
    )


class SyntheticWeights(WeightSource):
    quant: QuantFormat

    def __init__(self, fmt: QuantFormat, seed: int = 0) -> None:
        self.quant = fmt
        self.seed = seed

    def _rng(self, name: str) -> np.random.Generator:
        # One stream per tensor name: the weights do not depend on the order they are asked for.
        return np.random.default_rng([self.seed, zlib.crc32(name.encode())])

    def has(self, name: str) -> bool:
        return not name.startswith("lm_head")  # tied

    def vector(self, name: str, n: int) -> np.ndarray:
        if name.endswith("bias"):
            return np.zeros(n, dtype=np.float32)
        return (1.0 + 0.05 * self._rng(name).standard_normal(n)).astype(np.float32)

    def matrix(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        return (self._rng(name).standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def linear(self, name: str, rows: int, cols: int) -> Weight:
        return Weight(self._blocks(name, (rows,), cols), self.quant.attrs())

    def experts(self, names: list[str], fused: tuple[str, int] | None, rows: int, cols: int) -> Weight:
        return Weight(self._blocks(names[0], (len(names), rows), cols), self.quant.attrs())

    def _blocks(self, name: str, lead: tuple[int, ...], cols: int) -> np.ndarray:
        fmt = self.quant
        rng = self._rng(name)
        data: np.ndarray = rng.integers(0, 256, size=(*lead, fmt.blocks(cols), fmt.block_bytes), dtype=np.uint8)
        levels = (1 << fmt.bits) - 1
        spread = np.sqrt((levels + 1) ** 2 / 12.0)  # std of uniform random quants
        d = np.float16(1.0 / (spread * np.sqrt(cols)))
        data[..., 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
        if not fmt.symmetric:  # centre the asymmetric range on zero
            data[..., 2:4] = np.frombuffer(np.float16(-float(d) * levels / 2).tobytes(), dtype=np.uint8)
        elif fmt.bits == 8:  # keep int8 quants in [-127, 127]
            q = data[..., fmt.header_bytes:]
            q[q == 0x80] = 0x81
        return data.reshape(*lead, fmt.blocks(cols) * fmt.block_bytes)


def load_synthetic(size: str = "qwen3-0.6b", quant: str | QuantFormat = "q4", *,
                   backends: Sequence[str] | str | None = None, on_fallback: str = "warn", threads: int | None = None,
                   context: int = 4096, prefill_chunk: int = 512, seed: int = 0, progress: bool = True,
                   linear_attention_mode: str = "auto", kv_cache: str = "f16") -> Llm:
    """A synthetic model with the shapes of ``size`` ("qwen3-0.6b", "tiny", or the hybrid "qwen3.5-0.8b",
    "qwen3.5-2b", "qwen3.5-tiny"), quantized as ``quant``. ``linear_attention_mode`` ("auto", "chunked",
    "recurrent") sets the GatedDeltaRule nodes' form (measuring the chunked prefill against the recurrence)."""
    fmt = parse_quant(quant)
    if fmt is None:
        raise HeteroError("a synthetic model needs a quantization format, e.g. quant='q4'")
    cfg = synthetic_config(size)
    graph = build_graph(cfg, SyntheticWeights(fmt, seed), context=context, progress=progress)
    for node in graph.nodes:
        if node.op_type == "GatedDeltaRule":
            node.attrs["mode"] = linear_attention_mode
    family = "qwen3.5" if size in HYBRID_SHAPES else "qwen3"
    return Llm(cfg, graph, None, context=context, backends=backends, on_fallback=on_fallback, threads=threads,
               prefill_chunk=prefill_chunk, name=f"{family} {LABELS[size]} synthetic", quant=fmt.name,
               kv_cache=kv_cache)
