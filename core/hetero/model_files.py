"""What kind of model a path given on the command line is: an ONNX file, a GGUF file, a Hugging Face folder (or a
repo id that ``hetero.llm.load`` looks up in the local Hugging Face cache). Commands dispatch on it."""

from __future__ import annotations

import re
from pathlib import Path

from .contract.errors import ModelFormatError
from .llm.gguf import is_gguf

ONNX, GGUF, HF_FOLDER, HF_REPO = "onnx", "gguf", "hf-folder", "hf-repo"
LLM_KINDS = (GGUF, HF_FOLDER, HF_REPO)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # "Qwen/Qwen3-0.6B"


def model_kind(path: str) -> str:
    """ONNX / GGUF / HF_FOLDER / HF_REPO, or a ``ModelFormatError`` saying what ``path`` is instead."""
    p = Path(path)
    if p.is_dir():
        if (p / "config.json").is_file():
            return HF_FOLDER
        models = sorted(q.name for q in p.iterdir() if q.suffix.lower() in (".onnx", ".gguf"))
        hint = f"give one of its files: {', '.join(models[:5])}" if models else None
        raise ModelFormatError(f"{path} is a folder without config.json: expected an .onnx or .gguf file, or a "
                               "Hugging Face model folder", hint=hint)
    if p.is_file():
        if is_gguf(p):  # (a regular file, size-checked: never a FIFO read that blocks)
            return GGUF
        if p.suffix.lower() == ".gguf":
            raise ModelFormatError(f"{path} does not start with the GGUF magic: not a GGUF file (or a truncated one)")
        return ONNX
    if _REPO_ID.match(path) and not p.suffix:
        return HF_REPO
    raise ModelFormatError(f"{path} does not exist")

