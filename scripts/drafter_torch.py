"""The Eagle-3 head and the DFlash drafter as PyTorch modules, with parameter names of the published layouts.

scripts/train_drafter.py trains them; tests/llm/test_drafters_torch.py uses them as the reference the numpy
drafters of hetero.llm.speculative must match. Written from the networks' descriptions (docs/speculative.md), in
plain torch ops: an independent implementation, not a transcription of hetero's numpy code.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` ``[T, heads, d]`` at ``positions`` ``[T]``."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = positions.to(torch.float64)[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().to(x.dtype)[:, None], ang.sin().to(x.dtype)[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, inp: int, hidden: int, heads: int, kv_heads: int, head_dim: int, qk_norm: bool,
                 eps: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(inp, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(inp, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(inp, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)
        self.qk_norm = qk_norm

    def q(self, x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
        q = self.q_proj(x).view(x.shape[0], self.heads, self.head_dim)
        return rotary(self.q_norm(q) if self.qk_norm else q, pos, theta)

    def kv(self, x: torch.Tensor, pos: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.k_proj(x).view(x.shape[0], self.kv_heads, self.head_dim)
        k = rotary(self.k_norm(k) if self.qk_norm else k, pos, theta)
        return k, self.v_proj(x).view(x.shape[0], self.kv_heads, self.head_dim)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``q`` [Tq, H, d], ``k``/``v`` [Tk, Hkv, d], ``mask`` [Tq, Tk] (True: visible)."""
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                             attn_mask=mask)
        return self.o_proj(out.transpose(0, 1).reshape(q.shape[0], -1))


class Mlp(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: dict, attn_in: int, qk_norm: bool) -> None:
        super().__init__()
        h, eps = c["hidden_size"], c["rms_norm_eps"]
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.self_attn = Attention(attn_in, h, c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                                   qk_norm, eps)
        self.mlp = Mlp(h, c["intermediate_size"])


class Eagle3(nn.Module):
    """Tensor names: fc, midlayer.{hidden_norm, input_layernorm, self_attn.*, post_attention_layernorm, mlp.*},
    norm, lm_head, and the buffers d2t / t2d."""

    def __init__(self, c: dict) -> None:
        super().__init__()
        h = c["hidden_size"]
        self.c = c
        self.fc = nn.Linear(3 * c.get("target_hidden_size", h), h, bias=False)
        self.midlayer = Layer(c, 2 * h, qk_norm=False)
        self.midlayer.hidden_norm = RMSNorm(h, c["rms_norm_eps"])
        self.norm = RMSNorm(h, c["rms_norm_eps"])
        self.lm_head = nn.Linear(h, c["draft_vocab_size"], bias=False)
        self.register_buffer("d2t", torch.zeros(c["draft_vocab_size"], dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c["vocab_size"], dtype=torch.bool))

    def qkv(self, feat: torch.Tensor, emb: torch.Tensor, pos: torch.Tensor):
        m = self.midlayer
        x = torch.cat([m.input_layernorm(emb), m.hidden_norm(feat)], -1)
        k, v = m.self_attn.kv(x, pos, self.c["rope_theta"])
        return m.self_attn.q(x, pos, self.c["rope_theta"]), k, v

    def finish(self, feat: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = feat + attn
        return h + self.midlayer.mlp(self.midlayer.post_attention_layernorm(h))

    def step(self, feat, emb, pos, past_k, past_v, mask):
        """One pass over rows; keys are ``past`` then the rows'. Returns (hidden out, k, v)."""
        q, k, v = self.qkv(feat, emb, pos)
        attn = self.midlayer.self_attn.attend(q, torch.cat([past_k, k]), torch.cat([past_v, v]), mask)
        return self.finish(feat, attn), k, v

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))

    def unrolled(self, target_hidden: torch.Tensor, emb_next: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """The training-time-test unroll over a sequence: row ``j`` of step 0 reads the target feature of token
        ``j`` and the embedding of token ``j + 1``; row ``j`` of step ``s`` reads step ``s - 1``'s output at row
        ``j - 1`` instead of a feature, and sees step 0's keys up to ``j - s`` plus its own chain's rows of steps
        1..s (what drafting depth ``s + 1`` sees). Returns each step's logits; row ``j`` predicts token ``j + 2``.
        """
        n = target_hidden.shape[0]
        pos = torch.arange(n)
        feat = self.fc(target_hidden)
        ks, vs, outs = [], [], []
        idx = torch.arange(n)
        for s in range(steps):
            if s > 0:
                feat = torch.cat([torch.zeros_like(feat[:1]), outs[-1][:-1]])
            q, k, v = self.qkv(feat, emb_next, pos)
            ks.append(k)
            vs.append(v)
            masks = [idx[None, :] <= (idx[:, None] - s)]
            masks += [idx[None, :] == (idx[:, None] - s + t) for t in range(1, s + 1)]
            mask = torch.cat(masks, 1)
            mask[:, 0] |= ~mask.any(1)  # rows before any context (j < s) see something; they are not scored
            attn = self.midlayer.self_attn.attend(q, torch.cat(ks), torch.cat(vs), mask)
            outs.append(self.finish(feat, attn))
        return [self.logits(o) for o in outs]


class DFlash(nn.Module):
    """Tensor names: fc, hidden_norm, layers.{i}.{input_layernorm, self_attn.* (with q_norm / k_norm),
    post_attention_layernorm, mlp.*}, norm. No embedding, no LM head: the target's are passed in."""

    def __init__(self, c: dict) -> None:
        super().__init__()
        h, d = c["hidden_size"], c["dflash_config"]
        self.c = c
        self.fc = nn.Linear(len(d["target_layer_ids"]) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, c["rms_norm_eps"])
        self.layers = nn.ModuleList(Layer(c, h, qk_norm=True) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(h, c["rms_norm_eps"])

    def forward(self, target_hidden, ctx_pos, noise, block_pos, mask=None) -> torch.Tensor:
        """``target_hidden`` [C, n*H] at ``ctx_pos``; ``noise`` [B, H] (token embeddings) at ``block_pos``;
        ``mask`` [B, C + B] (None: all visible). Returns the normed rows [B, H]."""
        theta = self.c["rope_theta"]
        ctx = self.hidden_norm(self.fc(target_hidden))
        h = noise
        for layer in self.layers:
            a = layer.self_attn
            x = layer.input_layernorm(h)
            kc, vc = a.kv(ctx, ctx_pos, theta)
            kb, vb = a.kv(x, block_pos, theta)
            h = h + a.attend(a.q(x, block_pos, theta), torch.cat([kc, kb]), torch.cat([vc, vb]), mask)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)


def state_tensors(module: nn.Module) -> dict:
    """The module's tensors as float32 / int64 / bool numpy arrays, by published name."""
    out = {}
    for name, t in module.state_dict().items():
        a = t.detach().cpu()
        out[name] = (a.float() if a.is_floating_point() else a).numpy()
    return out
