"""A prefix cache: prompts computed once, their state reused by the next prompt that starts the same way.

Set ``llm.prefix_cache = PrefixCache(max_bytes)`` (one cache may serve several models of one file: the slots of a
server). After each prompt, the model keeps a ``hetero.llm.snapshot.Snapshot`` of it here; before computing a
prompt, it restores the longest cached prefix of it that its own KV cache does not already hold. Entries go least
recently used first once their bytes pass ``max_bytes``.

What can be reused depends on the model: attention-only models (Qwen2 / Qwen3) reuse any common prefix (a shared
system prompt, a conversation's earlier turns); models with a recurrent state (Qwen3.5's GatedDeltaRule layers) only
a whole earlier prompt (the state exists at its end, not in the middle).

With ``directory``, every snapshot kept is also written there as a prefix-cache file
(``hetero.llm.prompt_cache_file``, named by a hash of the model's key and the tokens), and files there that fit the
model are looked up like the entries in memory: a restarted server finds its prompts again. Files that do not fit
(another model or model file version, backend, KV cache type) are passed over; a damaged one is ignored with a
warning. The folder is kept under ``directory_bytes``, the least recently used files deleted first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..contract.errors import HeteroError
from . import prompt_cache_file as pcf
from . import snapshot
from .prompt_cache import model_key, warn
from .snapshot import Snapshot, common_prefix

SUFFIX = ".hpc"


@dataclass
class PrefixCacheStats:
    hits: int = 0  # prompts that restored a prefix from the cache
    misses: int = 0  # prompts that found nothing longer than their own cache held
    tokens_saved: int = 0  # prompt tokens restored instead of computed
    stored: int = 0  # snapshots taken
    evicted: int = 0  # snapshots dropped for room
    files_written: int = 0  # snapshots written to the directory
    file_hits: int = 0  # prompts restored from a file of the directory


class PrefixCache:
    """Snapshots of computed prompts, least recently used out first past ``max_bytes``. A prompt shorter than
    ``min_tokens`` is neither kept nor looked up (its snapshot would cost more than computing it)."""

    def __init__(self, max_bytes: int, min_tokens: int = 32, directory: str | os.PathLike | None = None,
                 directory_bytes: int = 4 << 30) -> None:
        if max_bytes < 0 or min_tokens < 1 or directory_bytes < 0:
            raise HeteroError(f"PrefixCache(max_bytes={max_bytes}, min_tokens={min_tokens}, directory_bytes="
                              f"{directory_bytes}): expected sizes >= 0 / 1 / 0")
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise HeteroError(f"prefix cache directory {self.directory}: cannot create it ({exc})") from None
        self.directory_bytes = directory_bytes
        self._files: dict[str, dict[tuple[int, ...], tuple[Path, bool]]] = {}  # model key -> tokens -> file
        self._scanned: dict[str, int] = {}  # model key -> the directory's mtime_ns when it was last read
        self._directory_off: str | None = None  # why the directory is not used (the model has no key)
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
                n = _restorable(snap, prompt)
                if n > length:
                    best, length, best_key = snap, n, key
            if best is not None:
                self._entries.move_to_end(best_key)
        if self.directory is not None:
            restored = self._restore_file(llm, slot, prompt, length)
            if restored:
                with self._lock:
                    self.stats.hits += 1
                    self.stats.file_hits += 1
                    self.stats.tokens_saved += restored - own
                return restored
        if best is None:
            with self._lock:
                self.stats.misses += 1
            return 0
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
        if self._disabled or len(key) <= self.min_tokens or (self.max_bytes == 0 and self.directory is None):
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
        if self.directory is not None:
            self._write_file(llm, snap)
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
        """Forget the snapshots in memory (files in the directory stay)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    # -- the directory --------------------------------------------------------------------------------------------
    def _key(self, llm: Any) -> tuple[dict[str, Any], str] | None:
        if self._directory_off is not None:
            return None
        try:
            key = model_key(llm)
        except HeteroError as exc:  # e.g. the model file changed since loading: files are neither read nor written
            if self._directory_off is None:
                warn(f"prefix cache directory {self.directory} not used: {exc}")
            self._directory_off = str(exc)
            return None
        return key, json.dumps(key, sort_keys=True)

    def _write_file(self, llm: Any, snap: Snapshot) -> None:
        assert self.directory is not None
        keyed = self._key(llm)
        if keyed is None:
            return
        key, text = keyed
        tokens = np.asarray(snap.tokens, dtype=np.int64).tobytes()
        path = self.directory / (hashlib.sha256(text.encode() + tokens).hexdigest()[:40] + SUFFIX)
        try:
            if path.exists():
                os.utime(path)
            else:
                pcf.write(path, key, snap)
                with self._lock:
                    self.stats.files_written += 1
            self._prune()
        except (OSError, HeteroError) as exc:  # a full disk: the prompt stays in memory only
            warn(f"prefix cache file {path} not written: {exc}")
            return
        with self._lock:
            self._files.setdefault(text, {})[snap.tokens] = (path, snap.recurrent)

    def _index(self, text: str) -> dict[tuple[int, ...], tuple[Path, bool]]:
        """The directory's files of the model keyed ``text`` (read again when the directory changed)."""
        assert self.directory is not None
        try:
            stamp = os.stat(self.directory).st_mtime_ns
        except OSError:
            return {}
        with self._lock:
            if self._scanned.get(text) == stamp:
                return dict(self._files.get(text, {}))
        found: dict[tuple[int, ...], tuple[Path, bool]] = {}
        wanted = json.loads(text)
        for path in sorted(self.directory.glob("*" + SUFFIX)):
            try:
                meta = pcf.read_meta(path)
            except (OSError, HeteroError):
                continue  # a file being replaced, or damaged: it is judged (and warned of) when used
            if pcf.mismatch(meta["key"], wanted) is None:
                found[tuple(meta["tokens"])] = (path, meta["recurrent"])
        with self._lock:
            self._files[text] = found
            self._scanned[text] = stamp
        return dict(found)

    def _restore_file(self, llm: Any, slot: int, prompt: Sequence[int], length: int) -> int:
        """Restore from the directory's file holding more of ``prompt`` than ``length`` tokens, if any."""
        keyed = self._key(llm)
        if keyed is None:
            return 0
        key, text = keyed
        best: tuple[Path, int] | None = None
        for tokens, (path, recurrent) in self._index(text).items():
            n = _restorable(Snapshot(tokens, {}, "", recurrent), prompt)
            if n > length:
                best, length = (path, n), n
        if best is None:
            return 0
        path, n = best
        try:
            with pcf.open_file(path, key) as cached:
                snapshot.restore(llm, slot, cached.snapshot(), n)
                llm.tokens = list(cached.tokens[:n])
        except HeteroError as exc:
            llm.tokens = []  # its state may be half restored: forget it
            warn(f"prefix cache file not used{' (deleted)' if isinstance(exc, pcf.BadFile) else ''}: {exc}")
            with self._lock:
                self._files[text] = {t: f for t, f in self._files.get(text, {}).items() if f[0] != path}
            if isinstance(exc, pcf.BadFile):
                with contextlib.suppress(OSError):
                    path.unlink()  # damaged (our folder, our file): gone, so it is not tried again
            return 0
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: pruned last
        return n

    def _prune(self) -> None:
        """Delete the least recently used files while the directory holds more than ``directory_bytes``."""
        assert self.directory is not None
        files = []
        for path in self.directory.glob("*" + SUFFIX):
            with contextlib.suppress(OSError):
                st = path.stat()
                files.append((st.st_mtime_ns, st.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.directory_bytes:
                break
            with contextlib.suppress(OSError):
                path.unlink()
                total -= size


def _restorable(snap: Snapshot, prompt: Sequence[int]) -> int:
    """How many tokens of ``prompt`` ``snap`` restores: the last token is always run (its logits predict), and a
    recurrent state only where it stands (0 otherwise)."""
    n = min(snap.usable(prompt), len(prompt) - 1)
    return n if not snap.recurrent or n == len(snap.tokens) else 0


__all__ = ["PrefixCache", "PrefixCacheStats"]
