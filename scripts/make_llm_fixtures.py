"""Make the tiny Qwen2 / Qwen3 / Qwen3-MoE / Qwen3.5 / Qwen3-Next fixtures of tests/llm from transformers.

Needs torch and transformers (the test suite does not):  pip install torch==2.13.0 transformers
Run from the repository root:                           python scripts/make_llm_fixtures.py

For each family it writes tests/fixtures/llm/<name>/: a Hugging Face folder (config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json with a ChatML chat template) with random weights,
plus expected.json (token ids, greedy continuations, the rendered chat) and logits.npz (float32 logits of every
prompt position, eager attention). A byte-level BPE tokenizer is trained on the small text below.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "llm"

CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model can still tell a story about a fox and a dog.
Heterogeneous inference runs each layer where it is fastest: on the CPU, on a GPU, or on an NPU.
Once upon a time there was a tiny language model that lived inside a phone. It liked numbers: 1, 2, 3, 42, 2024.
What is the capital of France? Paris is the capital of France. Berlin is the capital of Germany.
def add(a, b):
    return a + b
print(add(2, 3))
Hello! How are you today? I am fine, thank you. Can you help me write a poem about the sea?
The sea is wide and deep and blue; the waves come in, the waves go out.
Attention is all you need, said the paper; then came rotary embeddings, grouped queries and mixtures of experts.
Über den Wolken muss die Freiheit wohl grenzenlos sein. Café, naïve, résumé. 你好，世界。 こんにちは。
Tokens, tokens everywhere: the tokenizer splits text into pieces, and the model predicts the next piece.
"""

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

# A ChatML template in the style of Qwen's: a default system prompt, roles checked, optional thinking switch.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] not in ['user', 'assistant', 'tool'] %}"
    "{{- raise_exception('Conversation roles must be user, assistant or tool, got ' + message['role']) }}"
    "{%- endif %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

PROMPTS = [
    "The quick brown fox",
    "Once upon a time there was a tiny model. It liked",
    "def add(a, b):\n    return",
]
CHAT = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris is the capital of France."},
    {"role": "user", "content": "And of Germany?"},
]
GREEDY_TOKENS = 12

# (folder name, model_type, config overrides)
MODELS = [
    ("qwen2", "qwen2", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=False, rope_theta=10000.0, max_position_embeddings=64,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    )),
    ("qwen3", "qwen3", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, tie_word_embeddings=True, rope_theta=1000000.0,
    )),
    ("qwen3_moe", "qwen3_moe", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[1], tie_word_embeddings=True, rope_theta=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    )),
]


# Hybrid linear-attention families (Gated DeltaNet): the layer pattern mixes linear and full attention, and the
# prompts below cross several 64-token chunks of the chunked prefill (one ends mid-chunk).
HYBRID_LINEAR = dict(
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
)
HYBRID_MODELS = [
    ("qwen3_5", "qwen3_5_text", dict(
        hidden_size=64, intermediate_size=64, num_hidden_layers=4, tie_word_embeddings=True,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        **HYBRID_LINEAR)),
    ("qwen3_5_moe", "qwen3_5_moe_text", dict(
        hidden_size=64, num_hidden_layers=3, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
        layer_types=["linear_attention", "full_attention", "linear_attention"], **HYBRID_LINEAR)),
    # Qwen3-Next (fused, per-key-head interleaved in_proj_qkvz / in_proj_ba), one dense layer (mlp_only_layers)
    ("qwen3_5_next", "qwen3_next", dict(
        hidden_size=64, intermediate_size=64, num_hidden_layers=3, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[1], tie_word_embeddings=True,
        layer_types=["linear_attention", "linear_attention", "full_attention"], **HYBRID_LINEAR)),
]
LONG_PROMPTS = [200, 100]  # tokens of the corpus: 3 chunks + 8, and 1 chunk + 36
LONG_ROWS = 7  # logits of every 7th position (and the last two) of the long prompts: they would be large


def train_tokenizer(vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    # Qwen's split: contractions, letters, single digits, punctuation runs, newlines, spaces; then byte-level.
    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([CORPUS] * 4, trainer)
    return tok


def write_tokenizer(folder: Path, tok) -> None:
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "add_prefix_space": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def randomize(model, seed: int) -> None:
    """Weights with more spread than the default init, so logits and greedy choices are well separated."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / max(p.shape[-1], 1) ** 0.5 * 1.5)


def slow_decay(model, seed: int) -> None:
    """Gated DeltaNet decay rates A = exp(A_log) between 0.003 and 0.3, so the recurrent state carries across
    64-token chunks (the random init forgets within a few tokens, which would hide chunk-boundary bugs)."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(-5.8, -1.2, generator=gen))


def greedy(model, ids: list[int], n: int) -> tuple[list[int], float]:
    """n greedy tokens by full recomputation; also the smallest top-1 / top-2 logit gap met on the way."""
    import torch

    seq = list(ids)
    gap = float("inf")
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq])).logits[0, -1]
            top = torch.topk(logits, 2).values
            gap = min(gap, float(top[0] - top[1]))
            seq.append(int(torch.argmax(logits)))
    return seq[len(ids):], gap


def make(name: str, model_type: str, overrides: dict, tok, seed: int) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = OUT / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    write_tokenizer(folder, tok)
    hf_tok = AutoTokenizer.from_pretrained(folder)
    eos = tok.token_to_id("<|im_end|>")
    pad = tok.token_to_id("<|endoftext|>")
    overrides = {"max_position_embeddings": 2048, **overrides}
    config = AutoConfig.for_model(model_type, vocab_size=tok.get_vocab_size(), rms_norm_eps=1e-6, eos_token_id=eos,
                                  bos_token_id=pad, **overrides)
    for attempt in range(20):
        torch.manual_seed(seed + attempt)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
        randomize(model, seed + attempt)
        if name in {m[0] for m in HYBRID_MODELS}:
            slow_decay(model, seed + attempt)
        prompts = []
        worst = float("inf")
        for text in PROMPTS:
            ids = hf_tok(text)["input_ids"]
            raw = tok.encode(text).ids
            assert ids == raw, f"transformers and tokenizers disagree on {text!r}: {ids} vs {raw}"
            tokens, gap = greedy(model, ids, GREEDY_TOKENS)
            worst = min(worst, gap)
            prompts.append({"text": text, "ids": ids, "greedy": tokens})
        rendered = hf_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        chat_ids = tok.encode(rendered, add_special_tokens=False).ids
        chat_greedy, gap = greedy(model, chat_ids, GREEDY_TOKENS)
        worst = min(worst, gap)
        if worst > 2e-3:
            break
    else:
        raise SystemExit(f"{name}: no seed gave well-separated greedy choices")
    model.save_pretrained(folder, safe_serialization=True)
    model.generation_config.do_sample = False
    model.generation_config.eos_token_id = [eos, pad]
    model.generation_config.save_pretrained(folder)
    logits = {}
    with torch.no_grad():
        for i, p in enumerate(prompts):
            logits[f"prompt{i}"] = model(torch.tensor([p["ids"]])).logits[0].numpy().astype(np.float32)
        # the chat's last position only: its full logits would double the fixture's size
        logits["chat_last"] = model(torch.tensor([chat_ids])).logits[0, -1:].numpy().astype(np.float32)
    long_prompts = []
    if name in {m[0] for m in HYBRID_MODELS}:
        corpus_ids = tok.encode(CORPUS).ids
        with torch.no_grad():
            for i, n in enumerate(LONG_PROMPTS):
                ids = corpus_ids[:n]
                rows = sorted(set(range(0, n, LONG_ROWS)) | {n - 2, n - 1})
                logits[f"long{i}"] = model(torch.tensor([ids])).logits[0, rows].numpy().astype(np.float32)
                tokens, gap = greedy(model, ids, GREEDY_TOKENS)
                long_prompts.append({"ids": ids, "rows": rows, "greedy": tokens, "gap": gap})
    np.savez_compressed(folder / "logits.npz", **logits)
    thinking_off = hf_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    expected = {
        "family": model_type,
        "seed": seed + attempt,
        "min_greedy_gap": worst,
        "prompts": prompts,
        "chat": {"messages": CHAT, "rendered": rendered, "rendered_no_thinking": thinking_off, "ids": chat_ids,
                 "greedy": chat_greedy},
        **({"long_prompts": long_prompts} if long_prompts else {}),
        "eos_ids": [eos, pad],
        "vocab_size": tok.get_vocab_size(),
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
    }
    (folder / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    return expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--vocab", type=int, default=320)
    parser.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    args = parser.parse_args()
    tok = train_tokenizer(args.vocab)
    only = {n for n in args.only.split(",") if n}
    for name, model_type, overrides in MODELS + HYBRID_MODELS:
        if only and name not in only:
            continue
        expected = make(name, model_type, overrides, tok, args.seed)
        size = sum(f.stat().st_size for f in (OUT / name).iterdir())
        gap = expected["min_greedy_gap"]
        print(f"{name}: {size / 1024:.0f} KiB, seed {expected['seed']}, min greedy gap {gap:.4f}")


if __name__ == "__main__":
    main()
