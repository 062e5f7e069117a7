"""A prefix cache: prompts computed once, their state reused by the next prompt that starts the same way.

Set ``llm.prefix_cache = PrefixCache(max_bytes)`` (one cache may serve several models of one file: the slots of a
server). After each prompt, the model keeps a ``hetero.llm.snapshot.Snapshot`` of it here; before computing a
prompt, it restores the longest cached prefix of it that its own KV cache does not already hold. Entries go least
recently used first once their bytes pass ``max_bytes``.

What can be reused depends on the model: attention-only models (Qwen2 / Qwen3) reuse any common prefix (a shared
system prompt, a conversation's earlier turns); models with a recurrent state (Qwen3.5's GatedDeltaRule layers) only
a whole earlier prompt (the state exists at its end, not in the middle).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..contract.errors import HeteroError
from . import snapshot
from .snapshot import Snapshot, common_prefix


@dataclass
class PrefixCacheStats:
    hits: int = 0  # prompts that restored a prefix from the cache
    misses: int = 0  # prompts that found nothing longer than their own cache held
    tokens_saved: int = 0  # prompt tokens restored instead of computed
    stored: int = 0  # snapshots taken
    evicted: int = 0  # snapshots dropped for room


class PrefixCache:
    """Snapshots of computed prompts, least recently used out first past ``max_bytes``. A prompt shorter than
    ``min_tokens`` is neither kept nor looked up (its snapshot would cost more than computing it)."""

    def __init__(self, max_bytes: int, min_tokens: int = 32) -> None:
        if max_bytes < 0 or min_tokens < 1:
            raise HeteroError(f"PrefixCache(max_bytes={max_bytes}, min_tokens={min_tokens}): expected sizes >= 0 / 1")
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self.stats = PrefixCacheStats()
        self._entries: OrderedDict[tuple[int, ...], Snapshot] = OrderedDict()  # oldest use first
        self._bytes = 0
        self._lock = threading.Lock()
        self._disabled: str | None = None  # why snapshots cannot be taken of these models (a backend without them)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def restore(self, llm: Any, slot: int, prompt: Sequence[int]) -> int:
        """Before ``prompt`` is computed on ``llm`` (its ``slot``, under the model's lock): restore the longest
        cached prefix of it, when longer than what the model's cache holds of it. Returns the tokens restored."""
        if self._disabled or len(prompt) <= self.min_tokens or llm.hidden_layers:
            return 0  # exposed hidden layers keep host copies of their rows, which a snapshot does not hold
        own = common_prefix(llm.tokens, prompt)
        best: Snapshot | None = None
        best_key: tuple[int, ...] = ()
        length = own
        with self._lock:
            for key, snap in self._entries.items():
                n = min(snap.usable(prompt), len(prompt) - 1)  # the last token is always run: its logits predict
                if n > length and (not snap.recurrent or n == len(snap.tokens)):
                    best, length, best_key = snap, n, key
            if best is None:
                self.stats.misses += 1
                return 0
            self._entries.move_to_end(best_key)
        try:
            snapshot.restore(llm, slot, best, length)
        except HeteroError as exc:  # e.g. a kernel that cannot import: the model computes the prompt from 0
            self._disabled = str(exc)
            llm.tokens = []  # its state may be half restored: forget it
            return 0
        llm.tokens = list(best.tokens[:length])
        with self._lock:
            self.stats.hits += 1
            self.stats.tokens_saved += length - own
        return length

    def store(self, llm: Any, slot: int, prompt: Sequence[int]) -> None:
        """After ``prompt`` was computed on ``llm`` (its cache holds exactly it): keep its snapshot."""
        key = tuple(prompt)
        if self._disabled or len(key) <= self.min_tokens or self.max_bytes == 0:
            return
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
        try:
            snap = snapshot.export(llm, slot, len(key))
        except HeteroError as exc:  # a backend whose kernels cannot export: the cache stays empty, said once
            self._disabled = str(exc)
            return
        if snap.nbytes > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = snap
            self._bytes += snap.nbytes
            self.stats.stored += 1
            while self._bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self._bytes -= old.nbytes
                self.stats.evicted += 1

    @property
    def disabled(self) -> str | None:
        """Why this cache keeps nothing (a model whose kernels cannot export their state), or None."""
        return self._disabled

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


__all__ = ["PrefixCache", "PrefixCacheStats"]
