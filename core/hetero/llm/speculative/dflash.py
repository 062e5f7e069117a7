"""DFlash: a block-diffusion drafter that fills ``[last token, mask x (B - 1)]`` in one non-causal pass.

Context: the target's hidden states at ``target_layer_ids`` for every verified token, concatenated, projected by
``fc`` and normed (``hidden_norm``). In each of the drafter's layers the block's queries attend, without a causal
mask, to keys/values built from that context (the layer's own k/v projections, cached per verified token) and from
the block itself. Block rows start as the target's token embeddings (the mask token's row for the unknown
positions); the drafter's final norm is followed by the *target's* LM head, so the drafter holds no vocabulary
matrix of its own (none in memory, none in its files). Row ``i`` of the block predicts the token at position
``n + i`` (``n``: the last token's position), so one pass drafts ``B - 1`` tokens.

Folder layout (z-lab ``*-DFlash-b16`` on the Hugging Face Hub): docs/speculative.md, "Drafter files".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...contract.errors import HeteroError
from .drafter_files import DrafterFolder, LayerShape, layer_ids
from .drafter_nn import LayerWeights, Linear, attention, rms_norm
from .feature_drafter import FeatureDrafter
from .native_linears import compile_for_target
from .registry import register
from .target import Target
from .target_head import TargetHead


@dataclass
class DFlashWeights:
    shape: LayerShape
    fc: Linear  # [len(target_layers) * target_hidden] -> [hidden]
    hidden_norm: np.ndarray
    layers: list[LayerWeights]
    norm: np.ndarray
    target_layers: tuple[int, ...]  # outputs of these target decoder layers (0-based)
    block_size: int
    mask_token_id: int
    embedding_scale: float = 1.0
    logit_scale: float = 1.0
    softcap: float = 0.0


def load_dflash(path: str | Path, *, target_layers: int | None = None) -> DFlashWeights:
    """``target_layers``: the target's depth, to check ``target_layer_ids`` against (unknown: not checked here)."""
    folder = DrafterFolder(path, "DFlash")
    d = folder.section("dflash_config")
    s = folder.layer_shape()
    if folder.has("lm_head.weight") or folder.has("embed_tokens.weight"):
        name = "lm_head.weight" if folder.has("lm_head.weight") else "embed_tokens.weight"
        raise HeteroError(f"{folder.path}: DFlash drafter holds {name!r}; hetero's DFlash shares the target's "
                          "embedding and LM head (no second vocabulary matrix)")
    n_target = d.int("num_target_layers", target_layers or (1 << 12), bound="layers")
    if target_layers is not None and n_target != target_layers:
        raise HeteroError(f"{folder.config_path}: the DFlash drafter was made for a target of {n_target} layers "
                          f"(key 'num_target_layers'); this target has {target_layers}")
    layers_used = layer_ids(d, "target_layer_ids", n_target)
    target_hidden = d.int("target_hidden_size", s.hidden, bound="hidden")
    vocab = d.int("vocab_size", bound="vocab")
    mask = d.token_id("mask_token_id", vocab)
    if mask is None:
        raise d.missing("mask_token_id")
    depth = d.int("num_hidden_layers", bound="layers")
    return DFlashWeights(
        shape=s,
        fc=folder.linear("fc.weight", s.hidden, len(layers_used) * target_hidden),
        hidden_norm=folder.tensor("hidden_norm.weight", (s.hidden,)),
        layers=[folder.layer(f"layers.{i}.", s, qk_norm=True) for i in range(depth)],
        norm=folder.tensor("norm.weight", (s.hidden,)),
        target_layers=layers_used,
        block_size=d.int("block_size", 16, minimum=2, bound="positions"),
        mask_token_id=mask,
        embedding_scale=d.float("input_embedding_scale", 1.0),
        logit_scale=d.float("output_multiplier", 1.0),
        softcap=d.float("final_logit_softcapping", 0.0) if d.get("final_logit_softcapping") is not None else 0.0,
    )


class DFlashDrafter(FeatureDrafter):
    """DFlash drafting for one target (a ``Drafter``): ``embed(ids)`` and ``lm_head(hidden)`` are the target's."""

    one_pass = True  # a draft of any length is one pass over the block: the policy prices it per drafting step

    def __init__(self, weights: DFlashWeights, embed: Callable[[Sequence[int]], np.ndarray],
                 lm_head: Callable[[np.ndarray], np.ndarray], *, num_layers: int) -> None:
        if max(weights.target_layers) >= num_layers:
            raise HeteroError(f"the DFlash drafter reads target layers {list(weights.target_layers)}; the target "
                              f"has {num_layers}")
        self.w = weights
        self.embed = embed
        self.lm_head = lm_head
        self.hidden_layers = weights.target_layers
        self.max_draft = weights.block_size - 1
        s = weights.shape
        empty = np.zeros((0, s.kv_heads, s.head_dim), np.float32)
        self.keys = [empty] * len(weights.layers)  # per layer: the context's keys, one row per verified token
        self.values = [empty] * len(weights.layers)

    @property
    def context(self) -> int:
        return len(self.keys[0]) if self.keys else 0

    @classmethod
    def for_target(cls, path: str | Path, llm: Target, *, linears: str | None = "q8") -> DFlashDrafter:
        """The drafter in folder ``path`` reading ``llm``'s hidden states, embedding table and LM head; its own
        linears run on the target's backends with weights in ``linears`` (``native_linears``; None: numpy)."""
        cfg = llm.config
        weights = load_dflash(path, target_layers=cfg.num_layers)
        width = weights.fc.shape[0] // len(weights.target_layers)
        if weights.shape.hidden != cfg.hidden_size or width != cfg.hidden_size:
            raise HeteroError(f"DFlash drafter {str(path)!r} has hidden size {weights.shape.hidden} and reads "
                              f"hidden states of width {width}; model {llm.name!r} has {cfg.hidden_size}")
        if weights.mask_token_id >= cfg.vocab_size:
            raise HeteroError(f"DFlash drafter {str(path)!r}: mask_token_id {weights.mask_token_id} is outside "
                              f"model {llm.name!r}'s vocabulary of {cfg.vocab_size}")
        head = TargetHead(llm)
        drafter = cls(weights, head.embed, head.logits, num_layers=cfg.num_layers)
        compile_for_target([weights.fc, *(linear for layer in weights.layers for linear in layer.linears())], llm,
                           linears)
        return drafter

    def forget(self) -> None:
        self._truncate(0)

    def _truncate(self, rows: int) -> None:
        self.keys = [k[:rows] for k in self.keys]
        self.values = [v[:rows] for v in self.values]

    def observe(self, start: int, hidden: np.ndarray) -> None:
        """The target's hidden states (``[T, len(hidden_layers) * target_hidden]``) of the tokens at positions
        ``start .. start + T - 1``; context from ``start`` on is replaced."""
        if not 0 <= start <= self.context:
            raise HeteroError(f"DFlash: hidden states from position {start}, but only {self.context} positions "
                              "are known")
        self._truncate(start)
        s = self.w.shape
        ctx = rms_norm(np.asarray(hidden, np.float32) @ self.w.fc, self.w.hidden_norm, s.eps)
        positions = np.arange(start, start + len(ctx))
        for i, lw in enumerate(self.w.layers):
            k = s.rope.apply(lw.heads(ctx, lw.k, lw.k_norm, s.head_dim, s.eps), positions)
            self.keys[i] = np.concatenate([self.keys[i], k])
            self.values[i] = np.concatenate([self.values[i], lw.heads(ctx, lw.v, None, s.head_dim, s.eps)])

    def block_hidden(self, last_token: int) -> np.ndarray:
        """The drafter's normed output rows ``[B, hidden]`` for the block ``[last_token, mask x (B - 1)]`` placed
        right after the context."""
        w, s = self.w, self.w.shape
        n = self.context
        block = [last_token] + [w.mask_token_id] * (w.block_size - 1)
        h = np.asarray(self.embed(block), np.float32) * np.float32(w.embedding_scale)
        positions = np.arange(n, n + w.block_size)
        for i, lw in enumerate(w.layers):
            x = rms_norm(h, lw.input_norm, s.eps)
            q = s.rope.apply(lw.heads(x, lw.q, lw.q_norm, s.head_dim, s.eps), positions)
            k = s.rope.apply(lw.heads(x, lw.k, lw.k_norm, s.head_dim, s.eps), positions)
            v = lw.heads(x, lw.v, None, s.head_dim, s.eps)
            keys, values = np.concatenate([self.keys[i], k]), np.concatenate([self.values[i], v])
            h = h + attention(q, keys, values, None) @ lw.o
            h = h + lw.mlp(rms_norm(h, lw.post_norm, s.eps))
        return rms_norm(h, w.norm, s.eps)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        logits = np.asarray(self.lm_head(hidden), np.float32) * np.float32(self.w.logit_scale)
        if self.w.softcap > 0:
            logits = np.tanh(logits / self.w.softcap) * np.float32(self.w.softcap)
        return logits

    def draft(self, history: Sequence[int], k: int) -> list[int]:
        """Up to ``min(k, B - 1)`` tokens after ``history``; the target's hidden states must cover every token of
        ``history`` but the last (the context is trimmed to that)."""
        if k < 1:
            return []
        n = len(history) - 1
        if self.context < n:
            raise HeteroError(f"DFlash: the history has {n} verified tokens but hidden states of only "
                              f"{self.context}")
        self._truncate(n)
        rows = self.block_hidden(int(history[-1]))[1:1 + min(k, self.w.block_size - 1)]
        return [int(t) for t in np.argmax(self.logits(rows), axis=-1)]


def _dflash(argument: str, target: Target) -> DFlashDrafter:
    if not argument:
        raise HeteroError("--spec dflash:PATH needs the DFlash drafter's folder (config.json + model.safetensors)")
    return DFlashDrafter.for_target(argument, target)


register("dflash", _dflash)
