"""The LLM front ends as fuzz targets: each takes one file's bytes, writes them where the loader looks, and parses
them as ``hetero.llm.load`` would (run in a child process by ``hetero.testing.fuzz.ChildRunner``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "llm"


def _folder(files: dict[str, bytes]) -> tuple[tempfile.TemporaryDirectory, Path]:
    tmp = tempfile.TemporaryDirectory(prefix="hetero-fuzz-")
    folder = Path(tmp.name)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return tmp, folder


def gguf(data: bytes) -> None:
    """A GGUF file: header, metadata, config, tokenizer (one encode / decode) and the chat template."""
    from hetero.llm.gguf import GgufFile
    from hetero.llm.gguf_model import gguf_config, gguf_tokenizer
    from hetero.llm.sampler import from_gguf
    from hetero.llm.template import ChatTemplate

    tmp, folder = _folder({"model.gguf": data})
    with tmp:
        gf = GgufFile(folder / "model.gguf")
        try:
            cfg = gguf_config(gf)
            from_gguf(gf.metadata, gf.path)
            if "tokenizer.ggml.tokens" in gf.metadata:
                tok = gguf_tokenizer(gf, cfg)
                tok.decode(tok.encode("Hello, world! 123"))
                if tok.chat_template:  # a template's own refusal is a TemplateError: a HeteroError
                    ChatTemplate(tok.chat_template).render([{"role": "user", "content": "hi"}])
            for name in list(gf)[:8]:
                np.asarray(gf.array(name)).sum()
        finally:
            gf.close()


def safetensors(data: bytes) -> None:
    """A safetensors file: the header and every tensor's values."""
    from hetero.llm.safetensors import SafetensorsModel

    tmp, folder = _folder({"model.safetensors": data})
    with tmp:
        st = SafetensorsModel(folder)
        for name in st:
            st.float32(name).sum()


def config(data: bytes) -> None:
    """config.json."""
    from hetero.llm.config import load_config

    tmp, folder = _folder({"config.json": data})
    with tmp:
        load_config(folder)


def generation_config(data: bytes) -> None:
    """generation_config.json: read and turned into sampling defaults."""
    from hetero.llm.files import read_json
    from hetero.llm.sampler import from_generation_config

    tmp, folder = _folder({"generation_config.json": data})
    with tmp:
        from_generation_config(read_json(folder / "generation_config.json"), folder / "generation_config.json")


def tokenizer(data: bytes) -> None:
    """tokenizer.json beside the fixture's tokenizer_config.json: load, encode, decode, render the template."""
    from hetero.llm.tokenizer import Tokenizer

    tmp, folder = _folder({"tokenizer.json": data})
    with tmp:
        shutil.copy(FIXTURES / "qwen3" / "tokenizer_config.json", folder)
        tok = Tokenizer(folder)
        tok.decode(tok.encode("Hello, world! 123 <|im_end|>"))
        tok.render_chat([{"role": "user", "content": "hi"}])


def tokenizer_config(data: bytes) -> None:
    """tokenizer_config.json (its chat template rendered) beside the fixture's tokenizer.json."""
    from hetero.llm.tokenizer import Tokenizer

    tmp, folder = _folder({"tokenizer_config.json": data})
    with tmp:
        shutil.copy(FIXTURES / "qwen3" / "tokenizer.json", folder)
        tok = Tokenizer(folder)
        if tok.chat_template is not None:
            tok.render_chat([{"role": "user", "content": "hi"}])
