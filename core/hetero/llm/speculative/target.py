"""What speculative decoding uses of the target model (``hetero.llm.model.Llm``, which resolves drafter names
through this package and so is not imported by it)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Target(Protocol):
    name: str
    path: Path | None
    context: int
    threads: int | None
    kv_cache: str
    tokenizer: Any
    template: Any
    config: Any  # LlmConfig: vocab_size, num_layers, hidden_size
    tokens: list[int]  # the cached tokens
    _session_args: dict[str, Any]

    @property
    def stats(self) -> Any: ...

    @property
    def last(self) -> Any: ...

    def prefill(self, ids: Sequence[int]) -> np.ndarray: ...

    def forward(self, ids: Sequence[int]) -> np.ndarray: ...

    def verify(self, ids: Sequence[int]) -> np.ndarray: ...

    def rollback(self, length: int) -> None: ...

    def expose_hidden(self, layers: Sequence[int]) -> tuple[int, ...]: ...

    def hidden(self, layer: int, start: int, end: int) -> np.ndarray: ...

    def _advance(self, owner: object, ids: list[int], stats: Any = None, prompt_file: Any = None) -> np.ndarray: ...

    def _verify(self, owner: object, history: list[int], drafts: list[int]) -> np.ndarray: ...

    def _keep(self, owner: object, length: int) -> None: ...
