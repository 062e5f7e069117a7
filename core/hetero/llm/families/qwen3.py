"""Qwen3 (dense): RMSNorm on each query and key head before the rotary embedding, no projection biases."""

from __future__ import annotations

from ...contract.errors import ModelFormatError
from ...contract.graph import Graph
from ..config import LlmConfig
from ..weights import WeightSource
from .decoder import Naming, build_decoder

NAMING = Naming()


def build(cfg: LlmConfig, weights: WeightSource, **options) -> Graph:
    if not cfg.qk_norm or cfg.num_experts:
        raise ModelFormatError(f"the qwen3 builder got a {cfg.family} config")
    return build_decoder(cfg, weights, NAMING, **options)
