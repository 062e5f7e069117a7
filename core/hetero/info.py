"""``hetero info MODEL``: what a model file holds, read from its headers without running it.

ONNX: inputs / outputs with types and shapes (symbolic dimension names kept), opsets, producer, op counts, weights.
GGUF: architecture, sizes, context, the quantization mix (tensor types by count and bytes), tokenizer, chat
template, sampling keys. Hugging Face folder: the config's summary, weight files, tokenizer and chat template.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

from .contract.errors import ModelFormatError
from .llm.files import MAX_TEMPLATE_BYTES, read_json, read_text
from .model_files import GGUF, HF_FOLDER, ONNX, model_kind

Facts = dict[str, Any]


def model_info(path: str) -> Facts:
    kind = model_kind(path)
    if kind == ONNX:
        return onnx_info(Path(path))
    if kind == GGUF:
        return gguf_info(Path(path))
    if kind == HF_FOLDER:
        return hf_info(Path(path))
    raise ModelFormatError(f"{path} does not exist", hint=f"{path} looks like a Hugging Face repo id: "
                           "`hetero info` reads a local folder or file; give the model's folder")


# -- ONNX --------------------------------------------------------------------------------------------------------
def _dims(type_proto: Any) -> tuple[str, list[int | str] | None]:
    kind = type_proto.WhichOneof("value")
    if kind != "tensor_type":
        return (kind or "unknown"), None
    from onnx import TensorProto

    tensor = type_proto.tensor_type
    dtype = TensorProto.DataType.Name(tensor.elem_type).lower()
    if not tensor.HasField("shape"):
        return dtype, None
    dims: list[int | str] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                             for d in tensor.shape.dim]
    return dtype, dims


def onnx_info(path: Path) -> Facts:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends: the file is not an ONNX model
        raise ModelFormatError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from exc
    graph = model.graph
    weights = {t.name for t in graph.initializer}

    def values(items: Any) -> list[Facts]:
        out = []
        for v in items:
            if v.name in weights:
                continue
            dtype, dims = _dims(v.type)
            out.append({"name": v.name, "type": dtype, "shape": dims})
        return out

    ops: Counter[str] = Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                                for n in graph.node)
    params = 0
    for t in graph.initializer:
        count = 1
        for d in t.dims:
            count *= d
        params += count
    return {
        "format": "onnx", "path": str(path), "file_bytes": path.stat().st_size,
        "ir_version": model.ir_version, "producer": " ".join(x for x in (model.producer_name, model.producer_version)
                                                             if x),
        "opsets": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "inputs": values(graph.input), "outputs": values(graph.output),
        "nodes": len(graph.node), "ops": dict(ops.most_common()),
        "weights": len(graph.initializer), "params": params,
    }


# -- GGUF --------------------------------------------------------------------------------------------------------
def gguf_info(path: Path) -> Facts:
    from .llm.gguf import GgufFile
    from .llm.gguf_model import FILE_TYPES

    gf = GgufFile(path)
    meta = gf.metadata
    arch = str(meta.get("general.architecture", "?"))

    def key(name: str) -> Any:
        return meta.get(f"{arch}.{name}")

    mix: dict[str, Facts] = {}
    params = 0
    for t in gf.tensors.values():
        entry = mix.setdefault(t.type.name, {"tensors": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["bytes"] += t.nbytes
        count = 1
        for d in t.dims:
            count *= d
        params += count
    file_type = meta.get("general.file_type")
    template = meta.get("tokenizer.chat_template")
    tokens = meta.get("tokenizer.ggml.tokens")
    sampling = {k.removeprefix("general.sampling."): _plain(v) for k, v in meta.items()
                if k.startswith("general.sampling.")}
    return {
        "format": "gguf", "path": str(path), "file_bytes": path.stat().st_size, "gguf_version": gf.version,
        "name": meta.get("general.name"), "architecture": arch,
        "file_type": FILE_TYPES.get(file_type, str(file_type)) if file_type is not None else None,
        "context_length": key("context_length"), "layers": key("block_count"),
        "hidden_size": key("embedding_length"), "heads": key("attention.head_count"),
        "kv_heads": key("attention.head_count_kv"), "experts": key("expert_count"),
        "params": params, "tensors": len(gf.tensors),
        "quantization_mix": dict(sorted(mix.items(), key=lambda kv: -kv[1]["bytes"])),
        "tokenizer": {"model": meta.get("tokenizer.ggml.model"), "pre": meta.get("tokenizer.ggml.pre"),
                      "vocab": len(tokens) if tokens is not None else None,
                      "bos_token_id": _plain(meta.get("tokenizer.ggml.bos_token_id")),
                      "eos_token_id": _plain(meta.get("tokenizer.ggml.eos_token_id"))},
        "chat_template": _template_summary(template),
        "sampling": sampling,
    }


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _template_summary(template: Any) -> Facts | None:
    if not isinstance(template, str) or not template:
        return None
    markers = [m for m in ("<|im_start|>", "<|start_header_id|>", "[INST]", "<start_of_turn>") if m in template]
    return {"chars": len(template), "style": "chatml" if "<|im_start|>" in template else (markers[0] if markers
                                                                                          else "custom"),
            "thinking": "enable_thinking" in template or "<think>" in template,
            "tools": "tools" in template}


# -- Hugging Face folder -----------------------------------------------------------------------------------------
_CONFIG_KEYS = ("model_type", "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
                "num_experts", "num_experts_per_tok", "torch_dtype", "tie_word_embeddings", "rope_theta")


def hf_info(folder: Path) -> Facts:
    config = read_json(folder / "config.json", root=folder)
    text_config = config.get("text_config")
    text = text_config if isinstance(text_config, dict) else {}
    summary = {k: config.get(k, text.get(k)) for k in _CONFIG_KEYS if k in config or k in text}
    files = sorted(folder.glob("*.safetensors"))
    tokenizer_config = folder / "tokenizer_config.json"
    template = read_json(tokenizer_config, root=folder).get("chat_template") if tokenizer_config.is_file() else None
    if template is None and (folder / "chat_template.jinja").is_file():
        template = read_text(folder / "chat_template.jinja", MAX_TEMPLATE_BYTES, folder)
    generation_file = folder / "generation_config.json"
    generation = read_json(generation_file, root=folder) if generation_file.is_file() else {}
    return {
        "format": "huggingface", "path": str(folder), "config": summary,
        "weights": {"files": len(files), "bytes": sum(f.stat().st_size for f in files)},
        "tokenizer": (folder / "tokenizer.json").is_file(),
        "chat_template": _template_summary(template),
        "sampling": {k: generation[k] for k in ("do_sample", "temperature", "top_k", "top_p", "min_p",
                                                 "repetition_penalty") if k in generation},
    }


# -- text --------------------------------------------------------------------------------------------------------
def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def _shape(dims: list[int | str] | None) -> str:
    return "[?]" if dims is None else "[" + ", ".join(str(d) for d in dims) + "]"


def render(facts: Facts) -> str:
    lines = [f"{facts['path']} ({facts['format']})"]
    if facts["format"] == "onnx":
        lines.append(f"  size      {_size(facts['file_bytes'])}; {facts['params']:,} weight values in "
                     f"{facts['weights']} initializers")
        lines.append(f"  opsets    {', '.join(f'{d} {v}' for d, v in facts['opsets'].items())}; ir_version "
                     f"{facts['ir_version']}" + (f"; producer {facts['producer']}" if facts['producer'] else ""))
        for title in ("inputs", "outputs"):
            lines.append(f"  {title}")
            for v in facts[title]:
                lines.append(f"    {v['name']}: {v['type']}{_shape(v['shape'])}")
        ops = ", ".join(f"{op}×{n}" for op, n in facts["ops"].items())
        lines.append(f"  nodes     {facts['nodes']}: {ops}")
    elif facts["format"] == "gguf":
        lines.append(f"  name      {facts['name']}; architecture {facts['architecture']}; "
                     f"GGUF v{facts['gguf_version']}")
        shape = ", ".join(f"{k} {facts[k]}" for k in ("layers", "hidden_size", "heads", "kv_heads", "experts")
                          if facts[k] is not None)
        lines.append(f"  shape     {shape}; {facts['params'] / 1e6:.1f} M params")
        lines.append(f"  context   {facts['context_length']} tokens (trained)")
        mix = ", ".join(f"{t} {m['tensors']} tensors {_size(m['bytes'])}" for t, m in
                        facts["quantization_mix"].items())
        lines.append(f"  file type {facts['file_type']}; {_size(facts['file_bytes'])}; mix: {mix}")
        tok = facts["tokenizer"]
        lines.append(f"  tokenizer {tok['model']} (pre {tok['pre']}), {tok['vocab']} tokens, bos "
                     f"{tok['bos_token_id']}, eos {tok['eos_token_id']}")
        lines.append(f"  template  {_template_text(facts['chat_template'])}")
        sampling = ", ".join(f"{k} {v}" for k, v in facts["sampling"].items()) or \
            "none in the file (llama.cpp's defaults apply)"
        lines.append(f"  sampling  {sampling}")
    else:
        cfg = facts["config"]
        config = ", ".join(f"{k} {v}" for k, v in cfg.items())
        lines.extend(textwrap.wrap(config, 116, initial_indent="  config    ", subsequent_indent=" " * 12))
        lines.append(f"  weights   {facts['weights']['files']} safetensors file(s), {_size(facts['weights']['bytes'])}")
        lines.append(f"  tokenizer {'tokenizer.json' if facts['tokenizer'] else 'none (token ids only)'}")
        lines.append(f"  template  {_template_text(facts['chat_template'])}")
        sampling = ", ".join(f"{k} {v}" for k, v in facts["sampling"].items()) or "none (greedy)"
        lines.append(f"  sampling  {sampling} (generation_config.json)")
    return "\n".join(lines)


def _template_text(template: Facts | None) -> str:
    if template is None:
        return "none"
    extras = [x for x in ("thinking", "tools") if template[x]]
    return f"{template['style']}, {template['chars']} chars" + (f" ({', '.join(extras)})" if extras else "")
