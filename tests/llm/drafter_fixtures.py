"""Random-weight Eagle-3 and DFlash folders in their published layouts, for the drafter tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hetero.llm.speculative.drafter_files import write_folder


def eagle_config(hidden: int = 64, vocab: int = 320, draft_vocab: int = 96, target_hidden: int | None = None,
                 aux: list[int] | None = None) -> dict:
    c = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
         "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": vocab,
         "draft_vocab_size": draft_vocab, "tie_word_embeddings": False}
    if target_hidden is not None:
        c["target_hidden_size"] = target_hidden
    if aux is not None:
        c["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux}
    return c


def dflash_config(hidden: int = 64, vocab: int = 320, layers: int = 2, block: int = 6,
                  target_layers: tuple[int, ...] = (0, 1), target_depth: int = 2) -> dict:
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
            "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "num_hidden_layers": layers, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": vocab,
            "num_target_layers": target_depth, "block_size": block,
            "dflash_config": {"mask_token_id": vocab - 1, "target_layer_ids": list(target_layers)}}


def _layer(rng: np.random.Generator, prefix: str, c: dict, attn_in: int, qk_norm: bool) -> dict[str, np.ndarray]:
    h, heads, kv, d, inter = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                              c["intermediate_size"])

    def lin(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(np.float32)

    t = {prefix + "input_layernorm.weight": 1 + 0.1 * rng.standard_normal(h).astype(np.float32),
         prefix + "post_attention_layernorm.weight": 1 + 0.1 * rng.standard_normal(h).astype(np.float32),
         prefix + "self_attn.q_proj.weight": lin(heads * d, attn_in),
         prefix + "self_attn.k_proj.weight": lin(kv * d, attn_in),
         prefix + "self_attn.v_proj.weight": lin(kv * d, attn_in),
         prefix + "self_attn.o_proj.weight": lin(h, heads * d),
         prefix + "mlp.gate_proj.weight": lin(inter, h),
         prefix + "mlp.up_proj.weight": lin(inter, h),
         prefix + "mlp.down_proj.weight": lin(h, inter)}
    if qk_norm:
        t[prefix + "self_attn.q_norm.weight"] = 1 + 0.1 * rng.standard_normal(d).astype(np.float32)
        t[prefix + "self_attn.k_norm.weight"] = 1 + 0.1 * rng.standard_normal(d).astype(np.float32)
    return {k: np.asarray(v, np.float32) for k, v in t.items()}


def eagle_tensors(c: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, th = c["hidden_size"], c.get("target_hidden_size", c["hidden_size"])
    draft, vocab = c["draft_vocab_size"], c["vocab_size"]
    t = _layer(rng, "midlayer.", c, 2 * h, qk_norm=False)
    keep = np.sort(rng.choice(vocab, size=draft, replace=False))
    t2d = np.zeros(vocab, dtype=bool)
    t2d[keep] = True
    t.update({"fc.weight": (rng.standard_normal((h, 3 * th)) / np.sqrt(3 * th)).astype(np.float32),
              "midlayer.hidden_norm.weight": 1 + 0.1 * rng.standard_normal(h).astype(np.float32),
              "norm.weight": 1 + 0.1 * rng.standard_normal(h).astype(np.float32),
              "lm_head.weight": (rng.standard_normal((draft, h)) / np.sqrt(h)).astype(np.float32),
              "d2t": (keep - np.arange(draft)).astype(np.int64), "t2d": t2d})
    return t


def dflash_tensors(c: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h = c["hidden_size"]
    n = len(c["dflash_config"]["target_layer_ids"])
    t: dict[str, np.ndarray] = {}
    for i in range(c["num_hidden_layers"]):
        t.update(_layer(rng, f"layers.{i}.", c, h, qk_norm=True))
    t.update({"fc.weight": (rng.standard_normal((h, n * h)) / np.sqrt(n * h)).astype(np.float32),
              "hidden_norm.weight": 1 + 0.1 * rng.standard_normal(h).astype(np.float32),
              "norm.weight": 1 + 0.1 * rng.standard_normal(h).astype(np.float32)})
    return t


def eagle_folder(path: Path, seed: int = 0, **config) -> Path:
    c = eagle_config(**config)
    return write_folder(path, c, eagle_tensors(c, seed))


def dflash_folder(path: Path, seed: int = 0, **config) -> Path:
    c = dflash_config(**config)
    return write_folder(path, c, dflash_tensors(c, seed))
