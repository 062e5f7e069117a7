"""``hetero.llm.load``: one loader for Hugging Face folders and GGUF files -> ``Llm``.

Each format only opens its files into a ``ModelFiles`` (``model_files.py``); the options, the memory check and the
graph building are done once, here.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..contract.errors import HeteroError, HeteroWarning, ModelFormatError
from ..contract.graph import Graph
from ..contract.quant import QuantFormat, parse_quant
from ..contract.vendor_worker import cache_root
from . import files, safetensors
from .config import LlmConfig, load_config
from .families import build_graph
from .families.decoder import requantize as requantize_graph
from .families.decoder import restrict_head
from .hub import resolve_model
from .model import Llm, check_options
from .model_files import ModelFiles
from .sampler import from_generation_config
from .tokenizer import Tokenizer
from .weights import HfWeights
from .whole_decoder import whole_decoder

if TYPE_CHECKING:
    from .template import ChatTemplate

REQUANT_VERSION = 1  # of the re-quantized matrices' cache (load(requantize=))
# bytes per cached value of each KV cache type (q8: int8 with a float scale per 32 values; q4r / q3r: 4 / 3-bit codes
# with a float16 scale per 32 values)
KV_BYTES = {"f16": 2.0, "f32": 4.0, "q8": 1.125, "q4r": 0.5625, "q3r": 0.4375}


def load(path: str | os.PathLike, backends: Sequence[str] | str | None = None, on_fallback: str = "warn",
         threads: int | None = None, quant: str | QuantFormat | None = None, context: int = 4096, *,
         prefill_chunk: int = 512, all_logits: bool = False, cache: bool = True,
         progress: bool | None = None, kv_cache: str = "f16", chat_template: str | None = None,
         hidden_layers: Sequence[int] = (), embeddings: bool = False, slots: int = 1,
         head_rows: Sequence[int] | None = None, requantize: str | QuantFormat | None = None) -> Llm:
    """Load a Hugging Face folder (config.json, safetensors, tokenizer files), a GGUF file (``*.gguf``: its
    tensors memory-mapped in their stored types, its own tokenizer and chat template; ``quant`` then quantizes only
    the file's float matrices, without a cache), or a Hugging Face repo id from the local cache
    (``"Qwen/Qwen3-0.6B"``, see ``hetero.llm.hub``).

    backends / on_fallback / threads: as in ``hetero.Session``. quant: None keeps the stored float weights
    (memory-mapped); "q8" / "q4" (optionally "_asym", "_b64" / "_b128") quantize at load, cached in
    ``<model>/.hetero-cache`` so the next load is fast. context: KV cache length in tokens (checked against the
    machine's memory before anything is allocated). prefill_chunk: prompt tokens per step (0: all at once).
    all_logits: return logits for every prompt token (tests), not just the last. kv_cache: "f16" (default, half
    the memory), "f32" (exact), "q8", or the rotated 4 / 3-bit "q4r" / "q3r" (cpu; docs/long-context.md).
    chat_template: None uses the model's own template (test-rendered at load
    with bounded time and memory: one that exceeds the bounds is an error); "plain" uses a plain
    ``role: content`` format instead (the fallback for a model whose template is refused); any other string is a
    Jinja template to use instead of the model's. hidden_layers: decoder layers whose outputs every step also
    returns (``Llm.hidden``; what Eagle-3 / DFlash drafters read, see ``hetero.llm.speculative``). embeddings: let
    ``Llm.embed`` read the final hidden state (costs a little on every step). slots: sequences served by one copy
    of the weights, each with its own KV cache (``Llm.sequence(i)``; their decode steps and prompt chunks batch, see
    ``hetero.llm.batch``; a prompt runs in chunks of at most ``hetero.llm.batch.CHUNK`` tokens); the memory check
    counts every slot's cache. head_rows: token ids whose LM head rows are kept (a draft vocabulary): the logits'
    column j is then token ``head_rows[j]`` (``Llm.head_rows``); such a model drafts (``hetero.llm.speculative``),
    it does not generate. requantize: re-quantize the matrices stored in a block format of more bits per weight
    (q5_0, q6_k, q8...) to this one ("q4"...; after ``head_rows``, so only the kept rows): fewer bytes per token for
    a second rounding, which is what a draft model can afford (its drafts are checked: ``hetero.llm.speculative``).
    """
    check_options(context, prefill_chunk, kv_cache, slots)
    fmt = parse_quant(quant)
    wider = parse_quant(requantize)
    source = resolve_model(path)
    if source.is_file() and (source.suffix.lower() == ".gguf" or _is_gguf(source)):
        from .gguf_model import open_gguf

        model = open_gguf(source, fmt)
    elif source.is_dir():
        model = open_folder(source, fmt, cache=cache)
    else:
        raise ModelFormatError(f"{source} is not a model folder (expected a directory with config.json) or a "
                               "GGUF file")
    check_memory(model.config, context * slots, kv_cache, model.path)
    template = _template(model, chat_template)
    graph = build_graph(model.config, model.weights, context=context, all_logits=all_logits,
                        progress=model.progress if progress is None else progress)
    rows = _head_rows(head_rows, model.config.vocab_size, model.path)
    if rows is not None:
        restrict_head(graph, rows)
    if wider is not None:
        _requantize(graph, wider, model.path, rows)
    label = model.label if fmt is None or model.label == fmt.name else f"{model.label}+{fmt.name}"
    if wider is not None:
        label = f"{label}>{wider.name}"
    decoder = whole_decoder(backends, model, context, fmt)
    if decoder is not None and (rows is not None or wider is not None):
        what = "head_rows=" if rows is not None else "requantize="
        raise HeteroError(f"{model.path}: {decoder.name} runs the decoder whole: it takes no {what}",
                          hint="load the draft model on cpu / opencl")
    with model.releasing():
        return Llm(model.config, graph, model.tokenizer, context=context, backends=backends, decoder=decoder,
                   on_fallback=on_fallback, threads=threads, prefill_chunk=prefill_chunk, name=model.name,
                   quant=label, path=model.path, kv_cache=kv_cache, sampling=model.sampling,
                   mapped=model.mapped, template=template, hidden_layers=hidden_layers, embeddings=embeddings,
                   slots=slots, head_rows=rows)


def kv_cache_bytes(cfg: LlmConfig, context: int, kv_cache: str) -> int:
    """Bytes the attention layers' K/V caches take at ``context`` tokens."""
    attention_layers = sum(1 for i in range(cfg.num_layers) if not cfg.is_linear_layer(i))
    per_token = attention_layers * 2 * cfg.num_kv_heads * cfg.head_dim * KV_BYTES[kv_cache]
    return int(per_token * context)


def check_memory(cfg: LlmConfig, context: int, kv_cache: str, path: Path) -> None:
    """Refuse a context whose KV cache alone exceeds the machine's physical memory (it would end in
    ``std::bad_alloc`` or the OOM killer at the first step, not in a message)."""
    need = kv_cache_bytes(cfg, context, kv_cache)
    have = physical_memory()
    if have and need > have:
        raise HeteroError(f"{path.name}: context={context} needs {need / 2**30:.1f} GiB of {kv_cache} KV cache; this "
                          f"machine has {have / 2**30:.1f} GiB",
                          hint="use a smaller context (-c), or kv_cache='q8' / 'q4r'")


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no check
        return 0


def open_folder(folder: Path, fmt: QuantFormat | None, *, cache: bool = True) -> ModelFiles:
    """A Hugging Face model folder's files."""
    root = files.model_root(folder)
    cfg = load_config(folder)
    weights = HfWeights(folder, fmt, cache=cache)
    tokenizer = Tokenizer(folder, cfg.eos_token_ids, root=root) if (folder / "tokenizer.json").exists() else None
    generation = tokenizer.generation_config if tokenizer is not None else {}
    sampling = from_generation_config(generation, folder / "generation_config.json")
    mapped = [*weights.st.source_files(), *([weights.cache_path] if weights.cache_path is not None else [])]
    # show the bar when the load is slow: quantizing without a cache
    slow = fmt is not None and not (weights.cache_path is not None and weights.cache_path.is_file())
    label = fmt.name if fmt else _float_type(cfg.torch_dtype)
    return ModelFiles(cfg, weights, tokenizer, sampling, f"{cfg.family} {folder.name}", label, folder, mapped,
                      progress=slow)


def _template(model: ModelFiles, chat_template: str | None) -> ChatTemplate | None:
    from .template import ChatTemplate

    if chat_template is not None and not isinstance(chat_template, str):
        raise HeteroError(f"chat_template={chat_template!r}; expected None, 'plain' or a Jinja template string")
    tok = model.tokenizer
    if chat_template == "plain":
        return ChatTemplate.plain()
    text = chat_template if chat_template is not None else (tok.chat_template if tok is not None else None)
    if text is None:
        return None
    where = "chat_template=..." if chat_template is not None else f"{model.path}: the chat template"
    template = ChatTemplate(text, where, bos_token=tok.bos_token if tok else None,
                            eos_token=tok.eos_token if tok else None)
    template.probe()
    return template


def _requantize(graph: Graph, fmt: QuantFormat, path: Path, rows: np.ndarray | None) -> None:
    """``load(requantize=fmt)``: the graph's wider matrices re-quantized, kept for a GGUF file in
    ``$HETERO_CACHE_DIR/requantized`` (default ``~/.cache/hetero``; keyed by the file's path, size and modification
    time, the format and the head rows), so the next load of the same draft model maps them instead of
    computing them again (seconds per 100 M weights in numpy). A damaged or unwritable cache is recomputed."""
    cache = None
    if path.is_file():
        info = path.stat()
        heads = hashlib.sha256(rows.tobytes()).hexdigest() if rows is not None else ""
        key = hashlib.sha256(json.dumps([REQUANT_VERSION, str(path.resolve()), info.st_size, info.st_mtime_ns,
                                         fmt.name, heads]).encode()).hexdigest()[:16]
        cache = cache_root() / "requantized" / f"{path.stem}-{fmt.name}-{key}.safetensors"
    known: dict[str, np.ndarray] = {}
    if cache is not None and cache.is_file():
        try:
            stored = safetensors.SafetensorsFile(cache)
            known = {name: stored.raw(name) for name in stored.entries}
        except ModelFormatError:
            known = {}
    made = requantize_graph(graph, fmt, known)
    if cache is None or not made or all(made[name] is known.get(name) for name in made):
        return
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        safetensors.write(cache, made, {"hetero": f"requantized v{REQUANT_VERSION}", "format": fmt.name})
    except OSError as exc:
        warnings.warn(f"hetero: cannot write {cache}: {exc}; the next load re-quantizes again", HeteroWarning,
                      stacklevel=3)


def _head_rows(rows: Sequence[int] | None, vocab: int, path: Path) -> np.ndarray | None:
    if rows is None:
        return None
    try:
        ids = np.asarray(rows, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise HeteroError(f"{path}: head_rows must be token ids, got {type(rows).__name__}") from None
    bad = ids[(ids < 0) | (ids >= vocab)]
    if not len(ids) or len(bad) or len(np.unique(ids)) != len(ids):
        what = f"id {int(bad[0])} is outside [0, {vocab})" if len(bad) else "empty" if not len(ids) else "repeated ids"
        raise HeteroError(f"{path}: head_rows: {what}; expected distinct token ids of the model's vocabulary")
    return ids


def _is_gguf(path: Path) -> bool:
    from .gguf import is_gguf

    return is_gguf(path)


def _float_type(torch_dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(torch_dtype, torch_dtype)
