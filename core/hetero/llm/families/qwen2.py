"""Qwen2 / Qwen2.5: biases on the q, k and v projections, no q/k norm, dense SwiGLU MLP."""

from __future__ import annotations

from ...contract.errors import ModelFormatError
from ...contract.graph import Graph
from ..config import LlmConfig
from ..weights import WeightSource
from .decoder import Naming, build_decoder

NAMING = Naming()


def build(cfg: LlmConfig, weights: WeightSource, **options) -> Graph:
    if not cfg.qkv_bias or cfg.qk_norm or cfg.num_experts:
        raise ModelFormatError(f"the qwen2 builder got a {cfg.family} config")
    return build_decoder(cfg, weights, NAMING, **options)
