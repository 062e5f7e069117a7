"""Model families: each turns a config and a weight source into the decoder Graph."""

from __future__ import annotations

from collections.abc import Callable

from ...contract.errors import ModelFormatError
from ...contract.graph import Graph
from ..config import LlmConfig
from ..weights import WeightSource
from . import qwen2, qwen3, qwen3_5, qwen3_moe

BUILDERS: dict[str, Callable[..., Graph]] = {
    "qwen2": qwen2.build,
    "qwen3": qwen3.build,
    "qwen3_moe": qwen3_moe.build,
    "qwen3_next": qwen3_5.build,
    "qwen3_5": qwen3_5.build,
    "qwen3_5_moe": qwen3_5.build,
}


def build_graph(cfg: LlmConfig, weights: WeightSource, *, context: int, all_logits: bool = False,
                progress: bool = False) -> Graph:
    builder = BUILDERS.get(cfg.family)
    if builder is None:
        raise ModelFormatError(f"no graph builder for the {cfg.family!r} family")
    return builder(cfg, weights, context=context, all_logits=all_logits, progress=progress)
