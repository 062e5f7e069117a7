"""Helpers for the LLM tests: the tiny transformers-made models of tests/fixtures/llm (see
scripts/make_llm_fixtures.py) and copies of them converted to other weight dtypes."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np

import hetero.llm
from conftest import load_script
from hetero.contract.quant import f32_to_bf16
from hetero.llm import safetensors

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "llm"
FAMILIES = ["qwen2", "qwen3", "qwen3_moe"]
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def gguf_writer() -> ModuleType:
    """scripts/make_gguf_fixtures.py as a module (the GGUF tests skip without the gguf package it needs)."""
    import pytest

    pytest.importorskip("gguf", reason="the gguf package (GGUF writer and reference dequantizer) is absent")
    return load_script(SCRIPTS / "make_gguf_fixtures.py", "make_gguf_fixtures", shared=True)

def expected(family: str) -> dict:
    return json.loads((FIXTURES / family / "expected.json").read_text(encoding="utf-8"))


def reference_logits(family: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / family / "logits.npz") as data:
        return {k: data[k] for k in data.files}


def load(path: Path | str, **kwargs) -> hetero.llm.Llm:
    """A fixture model with the float32 KV cache: these tests compare with transformers at float32 tolerances (the
    default float16 cache moves these logits by ~5e-3; test_llm_runtime measures that separately)."""
    kwargs.setdefault("context", 256)
    kwargs.setdefault("kv_cache", "f32")
    kwargs.setdefault("on_fallback", "silent")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hetero.llm.load(path, **kwargs)


def copy_model(family: str, dest: Path, dtype: str = "F32") -> Path:
    """A copy of a fixture folder (without the expected outputs), its weights re-saved as F32, F16 or BF16."""
    folder = dest / family
    folder.mkdir(parents=True)
    for item in (FIXTURES / family).iterdir():
        if item.is_dir():
            continue  # a stray quantization cache is not part of the model
        if item.name not in ("model.safetensors", "expected.json", "logits.npz"):
            shutil.copy(item, folder / item.name)
    st = safetensors.SafetensorsModel(FIXTURES / family)
    tensors = {name: st.float32(name) for name in st}
    if dtype == "F16":
        tensors = {k: v.astype(np.float16) for k, v in tensors.items()}
    elif dtype == "BF16":
        tensors = {k: f32_to_bf16(v) for k, v in tensors.items()}
    safetensors.write(folder / "model.safetensors", tensors, {"format": "pt"},
                      bf16=frozenset(tensors) if dtype == "BF16" else frozenset())
    return folder
