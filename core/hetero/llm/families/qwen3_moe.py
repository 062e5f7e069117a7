"""Qwen3-MoE: Qwen3 attention, and routed SwiGLU experts (top-k of a softmax router, optionally renormalised) in
place of the dense MLP, except in ``mlp_only_layers`` and off the ``decoder_sparse_step`` grid."""

from __future__ import annotations

from ...contract.errors import ModelFormatError
from ...contract.graph import Graph
from ..config import LlmConfig
from ..weights import WeightSource
from .decoder import Naming, build_decoder

NAMING = Naming()


def build(cfg: LlmConfig, weights: WeightSource, **options) -> Graph:
    if not cfg.qk_norm or cfg.num_experts < 1 or not 1 <= cfg.num_experts_per_tok <= cfg.num_experts:
        raise ModelFormatError("the qwen3_moe builder needs q/k norm and 1 <= num_experts_per_tok <= num_experts "
                               "(config.json keys 'num_experts', 'num_experts_per_tok')")
    return build_decoder(cfg, weights, NAMING, **options)
