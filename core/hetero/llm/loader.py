"""``hetero.llm.load``: a Hugging Face model folder -> ``Llm``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..contract.errors import HeteroError, ModelFormatError
from ..contract.quant import QuantFormat, parse_quant
from .config import load_config
from .families import build_graph
from .model import Llm
from .tokenizer import Tokenizer
from .weights import HfWeights


def load(path: str | os.PathLike, backends: Sequence[str] | str | None = None, on_fallback: str = "warn",
         threads: int | None = None, quant: str | QuantFormat | None = None, context: int = 4096, *,
         prefill_chunk: int = 512, all_logits: bool = False, cache: bool = True,
         progress: bool | None = None, kv_cache: str = "f16") -> Llm:
    """Load a Hugging Face folder (config.json, safetensors, tokenizer files) or a GGUF file (``*.gguf``: its
    tensors memory-mapped in their stored types, its own tokenizer and chat template; ``quant`` then quantizes only
    the file's float matrices, without a cache).

    backends / on_fallback / threads: as in ``hetero.Session``. quant: None keeps the stored float weights
    (memory-mapped); "q8" / "q4" (optionally "_asym", "_b64" / "_b128") quantize at load, cached in
    ``<model>/.hetero-cache`` so the next load is fast. context: KV cache length in tokens. prefill_chunk: prompt
    tokens per step (0: all at once). all_logits: return logits for every prompt token (tests), not just the last.
    kv_cache: "f16" (default, half the memory) or "f32" (exact) for the keys and values the cache stores.
    """
    folder = Path(path)
    if folder.is_file() and (folder.suffix.lower() == ".gguf" or _is_gguf(folder)):
        from .gguf_model import load_gguf

        return load_gguf(folder, backends, on_fallback, threads, quant, context, prefill_chunk=prefill_chunk,
                         all_logits=all_logits, progress=progress, kv_cache=kv_cache)
    if not folder.is_dir():
        raise ModelFormatError(f"{folder} is not a model folder (expected a directory with config.json)")
    if not isinstance(context, int) or context < 1:
        raise HeteroError(f"context={context!r}; expected a positive number of tokens")
    cfg = load_config(folder)
    fmt = parse_quant(quant)
    weights = HfWeights(folder, fmt, cache=cache)
    if progress is None:  # show the bar when the load is slow: quantizing without a cache
        progress = fmt is not None and not (weights.cache_path is not None and weights.cache_path.is_file())
    graph = build_graph(cfg, weights, context=context, all_logits=all_logits, progress=progress)
    tokenizer = Tokenizer(folder, cfg.eos_token_ids) if (folder / "tokenizer.json").is_file() else None
    name = f"{cfg.family} {folder.name}"
    return Llm(cfg, graph, tokenizer, context=context, backends=backends, on_fallback=on_fallback, threads=threads,
               prefill_chunk=prefill_chunk, name=name, quant=fmt.name if fmt else _float_type(cfg.torch_dtype),
               path=folder, kv_cache=kv_cache)


def _is_gguf(path: Path) -> bool:
    from .gguf import is_gguf

    return is_gguf(path)


def _float_type(torch_dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(torch_dtype, torch_dtype)
