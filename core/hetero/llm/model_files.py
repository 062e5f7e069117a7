"""``ModelFiles``: what a format's opener (a Hugging Face folder, a GGUF file) hands to ``hetero.llm.load``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import LlmConfig
from .sampler import SamplingDefaults
from .tokenizer import Tokenizer
from .weights import WeightSource


@dataclass
class ModelFiles:
    """What a format's opener found: everything ``load`` needs besides the options."""

    config: LlmConfig
    weights: WeightSource
    tokenizer: Tokenizer | None
    sampling: SamplingDefaults
    name: str
    label: str  # weight types, for Llm.quant
    path: Path
    mapped: list[Path] = field(default_factory=list)  # files whose pages the model may read at run time
    progress: bool = False
    releasing: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
