"""A model's prompt state in a file, llama.cpp's ``--prompt-cache`` for hetero: ``Llm.save_prompt_cache(path)``,
``Llm.load_prompt_cache(path)``, ``generate(..., prompt_cache=PATH)``. The file format, its checks and its key are
``hetero.llm.prompt_cache_file``; this module keys a loaded model and moves state between it and a file.

A file that cannot be used — stale (the model file changed), foreign (another model, backend, KV cache type or
quantization), truncated, damaged — is ignored with a one-line ``PromptCacheWarning``, and the prompt is computed.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..contract.errors import HeteroError
from . import prompt_cache_file as pcf
from . import snapshot
from .snapshot import common_prefix


def model_key(llm: Any) -> dict[str, Any]:
    """What a file must match to be loaded into ``llm``: the model's content hash, the backend holding its state,
    the KV cache type, the quantization and the model's shape (a ``HeteroError`` when the model has no key)."""
    if llm.decoder is not None:
        raise HeteroError(f"{llm.decoder.name} runs {llm.name} whole: its state cannot be saved")
    nodes = snapshot._stateful(llm.session)  # refuses kernels that cannot export
    cfg = llm.config
    backends = sorted({str(getattr(getattr(kernel, "backend", None), "name", type(kernel).__name__))
                       for _, kernel in nodes})
    ops = {node.name: node.op_type for node, _ in llm.session.kernels()}
    return {"model_sha256": llm.identity.digest(), "backend": ",".join(backends), "kv_cache": llm.kv_cache,
            "quant": llm.quant, "fingerprint": snapshot.fingerprint(llm),
            "signature": [cfg.family, cfg.num_layers, cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim,
                          cfg.vocab_size, [[name, ops[name]] for name, _ in nodes]]}


def warn(message: str) -> None:
    warnings.warn(f"hetero: {message}", pcf.PromptCacheWarning, stacklevel=4)


def save(llm: Any, path: str | os.PathLike, logits: np.ndarray | None = None) -> int:
    """Write ``llm``'s cached tokens' state (and the last one's ``logits``, if given) to ``path``; its bytes.
    Called with the model's lock held. A ``HeteroError`` when the model or the file cannot take it."""
    if not llm.tokens:
        raise HeteroError("the model's cache is empty: nothing to save", hint="prefill or generate first")
    key = model_key(llm)
    snap = snapshot.export(llm, llm._slot, len(llm.tokens))
    try:
        return pcf.write(path, key, snap, logits)
    except OSError as exc:
        raise HeteroError(f"{path}: cannot write the prompt cache ({exc.strerror or exc})") from None


def restore(llm: Any, path: str | os.PathLike, prompt: Sequence[int] | None) -> tuple[int, np.ndarray | None]:
    """Load what ``path`` holds of ``prompt`` (None: all of it) into ``llm`` (under its lock) and set its tokens.
    Returns (tokens restored, the next-token logits when the file holds the whole prompt with them, else None).
    A missing file restores nothing, silently (the first run creates it); a bad one with a warning."""
    if not Path(path).exists():
        return 0, None
    try:
        key = model_key(llm)
    except HeteroError as exc:
        warn(f"prompt cache {path} not used: {exc}")
        return 0, None
    try:
        if prompt is not None:  # the metadata alone says whether the file helps (no checksum over the payload)
            meta = pcf.read_meta(path)
            if not _helps(llm, meta["tokens"], meta["recurrent"], prompt):
                return 0, None
        with pcf.open_file(path, key) as cached:
            length, logits = _usable(llm, cached, prompt)
            if length == 0:
                return 0, None
            try:
                snapshot.restore(llm, llm._slot, cached.snapshot(), length)
            except HeteroError:
                llm.tokens = []  # its state may be half restored: forget it
                raise
            llm.tokens = list(cached.tokens[:length])
            return length, None if logits is None else np.array(logits, dtype=np.float32).reshape(1, -1)
    except HeteroError as exc:
        warn(f"prompt cache not used: {exc}")
        return 0, None
    except OSError as exc:  # read_meta's open / read
        warn(f"prompt cache {path} not used: {exc.strerror or exc}")
        return 0, None


def _usable(llm: Any, cached: pcf.CacheFile, prompt: Sequence[int] | None) -> tuple[int, np.ndarray | None]:
    """How many of the file's tokens to restore for ``prompt``, and its logits when they finish the prompt."""
    if prompt is None:
        return len(cached.tokens), None
    common = _helps(llm, cached.tokens, cached.recurrent, prompt)
    if not common:
        return 0, None
    whole = common == len(cached.tokens)
    if whole and common == len(prompt) and cached.logits is not None:
        return common, cached.logits  # nothing left to compute
    if cached.recurrent:
        # the state exists at the file's end only; when that is the prompt's end the model rolls it back one
        # token to compute the last one (a replay of the recurrence, still far cheaper than the prompt)
        return common, None
    return min(common, len(prompt) - 1), None  # the last token is run: its logits predict


def _helps(llm: Any, tokens: Sequence[int], recurrent: bool, prompt: Sequence[int]) -> int:
    """The prompt tokens a file of ``tokens`` shares with ``prompt``, or 0 when it cannot help: the model holds as
    much already, or its state is recurrent and stands past the shared prefix."""
    common = common_prefix(tokens, prompt)
    if common <= common_prefix(llm.tokens, prompt) or (recurrent and common < len(tokens)):
        return 0
    return common


@dataclass
class PromptFile:
    """``generate(..., prompt_cache=path)``: load before the prompt is computed, save after (unless read-only)."""

    path: Path
    read_only: bool = False
    restored: int = 0

    def restore(self, llm: Any, prompt: Sequence[int]) -> np.ndarray | None:
        self.restored, logits = restore(llm, self.path, prompt)
        return logits

    def store(self, llm: Any, prompt: Sequence[int], logits: np.ndarray) -> None:
        if self.read_only or (self.restored == len(prompt)):
            return  # nothing new to save
        try:
            save(llm, self.path, logits)
        except HeteroError as exc:
            warn(f"prompt cache not saved: {exc}")


def prompt_file(value: Any, read_only: bool = False) -> PromptFile | None:
    """``generate``'s ``prompt_cache=`` argument: a path (str / PathLike) or None."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise HeteroError(f"prompt_cache={value!r}; expected a file path")
    return PromptFile(Path(value), bool(read_only))


__all__ = ["PromptFile", "model_key", "prompt_file", "restore", "save"]
