"""Reading and writing drafter folders (Eagle-3, DFlash): a Hugging Face folder with ``config.json`` and
safetensors, in the layouts their authors publish (docs/speculative.md, "Drafter files").

Every tensor is checked against the shape the config implies before it is used, and every problem is a
``ModelFormatError`` naming the file and the tensor or key. Float tensors (F32 / F16 / BF16) are read as float32;
linears become ``drafter_nn.Linear`` (``x @ linear``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...contract.errors import ModelFormatError
from .. import files, safetensors
from ..config import attention_sizes
from ..fields import Fields
from .drafter_nn import LayerWeights, Linear, Rope


@dataclass(frozen=True)
class LayerShape:
    """The sizes of a drafter's decoder layer(s), from its config.json."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    rope: Rope


class DrafterFolder:
    """A drafter's folder: its config (``fields``) and tensors, read on demand and shape-checked."""

    def __init__(self, path: str | Path, kind: str) -> None:
        self.path = Path(path)
        self.kind = kind
        if not self.path.is_dir():
            raise ModelFormatError(f"{kind} drafter {str(self.path)!r} is not a folder",
                                   hint="give the folder holding its config.json and model.safetensors")
        self.config_path = self.path / "config.json"
        self.config = files.read_json(self.config_path, files.MAX_JSON_BYTES, files.model_root(self.path))
        self.fields = Fields(self.config, self.config_path)
        self.tensors = safetensors.SafetensorsModel(self.path)

    def section(self, name: str) -> Fields:
        """A nested config object (``eagle_config``, ``dflash_config``) whose keys fall back to the top level."""
        return Fields({**self.config, **self.fields.object(name)}, f"{self.config_path} ({name})")

    def layer_shape(self, f: Fields | None = None) -> LayerShape:
        f = f or self.fields
        hidden, heads, kv_heads, head_dim = attention_sizes(f)
        if head_dim % 2:
            raise f.fail("head_dim", "an even number (rotary embedding)")
        return LayerShape(hidden, heads, kv_heads, head_dim, f.int("intermediate_size", bound="intermediate"),
                          f.float("rms_norm_eps", 1e-6, above=0), _rope(f, head_dim))

    def tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A float tensor as float32, which must have ``shape``."""
        entry = self._entry(name, shape)
        if entry.dtype not in ("F32", "F16", "BF16"):
            raise ModelFormatError(f"{entry.path}: tensor {name!r} has dtype {entry.dtype}; expected F32, F16 or BF16")
        return np.ascontiguousarray(self.tensors.float32(name), dtype=np.float32)

    def linear(self, name: str, out: int, inp: int) -> Linear:
        """A ``[out, in]`` Linear weight."""
        return Linear(self.tensor(name, (out, inp)).T)

    def integers(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """An integer or boolean tensor (Eagle-3's ``d2t`` / ``t2d``) as int64."""
        entry = self._entry(name, shape)
        if entry.dtype not in ("I64", "I32", "I16", "I8", "U8", "BOOL"):
            raise ModelFormatError(f"{entry.path}: tensor {name!r} has dtype {entry.dtype}; expected an integer "
                                   "or boolean type")
        return np.asarray(self.tensors.raw(name), dtype=np.int64)

    def has(self, name: str) -> bool:
        return name in self.tensors

    def _entry(self, name: str, shape: tuple[int, ...]) -> safetensors.TensorEntry:
        if name not in self.tensors:
            raise ModelFormatError(f"{self.path}: {self.kind} drafter tensor {name!r} is missing from its safetensors",
                                   hint=f"expected shape {list(shape)} (docs/speculative.md, 'Drafter files')")
        return self.tensors.checked(name, shape)

    def layer(self, prefix: str, s: LayerShape, *, attn_in: int | None = None, qk_norm: bool) -> LayerWeights:
        """A decoder layer's weights under ``prefix`` (``midlayer.``, ``layers.0.``) in Hugging Face naming.
        ``attn_in``: the q/k/v projections' input width (Eagle-3 feeds them ``2 * hidden``)."""
        inp = attn_in or s.hidden
        q_out, kv_out = s.heads * s.head_dim, s.kv_heads * s.head_dim
        attn, mlp = prefix + "self_attn.", prefix + "mlp."
        return LayerWeights(
            input_norm=self.tensor(prefix + "input_layernorm.weight", (s.hidden,)),
            post_norm=self.tensor(prefix + "post_attention_layernorm.weight", (s.hidden,)),
            q=self.linear(attn + "q_proj.weight", q_out, inp),
            k=self.linear(attn + "k_proj.weight", kv_out, inp),
            v=self.linear(attn + "v_proj.weight", kv_out, inp),
            o=self.linear(attn + "o_proj.weight", s.hidden, q_out),
            gate=self.linear(mlp + "gate_proj.weight", s.intermediate, s.hidden),
            up=self.linear(mlp + "up_proj.weight", s.intermediate, s.hidden),
            down=self.linear(mlp + "down_proj.weight", s.hidden, s.intermediate),
            q_norm=self.tensor(attn + "q_norm.weight", (s.head_dim,)) if qk_norm else None,
            k_norm=self.tensor(attn + "k_norm.weight", (s.head_dim,)) if qk_norm else None,
        )


def layer_ids(f: Fields, key: str, num_layers: int, count: int | None = None) -> tuple[int, ...]:
    """A list of target layer indices in ``[0, num_layers)`` (``count`` of them when given)."""
    value = f.get(key)
    if not isinstance(value, list) or not value or (count is not None and len(value) != count) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers for i in value):
        size = f"{count} " if count is not None else ""
        raise f.fail(key, f"a list of {size}target layer indices in [0, {num_layers})")
    return tuple(value)


def _rope(f: Fields, head_dim: int) -> Rope:
    # transformers 4 writes rope_theta (+ rope_scaling); transformers 5 nests them in rope_parameters.
    params = {**f.object("rope_scaling"), **f.object("rope_parameters")}
    p = Fields({**f.values, **params}, f"{f.path}: rope parameters")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "linear"):
        raise p.fail("rope_type", "'default' or 'linear' (the drafters' RoPE)")
    factor = p.float("factor", 1.0, above=0) if kind == "linear" else 1.0
    return Rope(head_dim, p.float("rope_theta", 10000.0, above=1), factor)


def write_folder(path: str | Path, config: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> Path:
    """Write a drafter folder (config.json + model.safetensors); used by scripts/train_drafter.py and the tests."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config), indent=2) + "\n", encoding="utf-8")
    safetensors.write(folder / "model.safetensors", tensors, {"format": "pt"})
    return folder
