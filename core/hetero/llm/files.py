"""Reading a model's small files safely: regular files only, size-capped, inside the model folder, JSON bounded.

A model folder comes from anywhere (a download, a shared disk), so nothing in it is trusted: ``config.json`` may be a
FIFO (a plain ``open`` would block forever), a symlink to ``/dev/zero`` (read until ``MemoryError``), a link out of
the folder, or JSON nested 100,000 deep or holding a 5,000-digit integer. ``read_json`` refuses each with a
``ModelFormatError`` naming the file before reading more than the cap.

``LIMITS`` bounds what a model file may ask for (layers, heads, sizes, context); the readers check every value
against them before anything is allocated from it. The bounds sit far above any released model (the largest have
~128 layers, 128 heads, head size 256, a 262k vocabulary, 512 experts, a 1M-token context).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from ..contract.errors import ModelFormatError

LIMITS: dict[str, int] = {
    "layers": 4096,
    "heads": 4096,
    "head_dim": 4096,
    "hidden": 1 << 17,
    "intermediate": 1 << 20,
    "vocab": 1 << 22,
    "experts": 4096,
    "positions": 1 << 26,  # max_position_embeddings / context_length as a file states them
    "conv_kernel": 64,
}
MAX_JSON_BYTES = 64 << 20  # config / generation_config / tokenizer_config
MAX_TOKENIZER_BYTES = 512 << 20  # tokenizer.json (the largest vocabularies are ~30 MB)
MAX_TEMPLATE_BYTES = 4 << 20  # chat_template.jinja (real ones are ~10 KB)
MAX_JSON_DEPTH = 64  # real model JSON nests < 10 deep


def limit(value: int, what: str, where: str) -> int:
    """``value`` if it is within ``LIMITS[what]``; else a ModelFormatError naming ``where`` (file + key)."""
    bound = LIMITS[what]
    if value > bound:
        raise ModelFormatError(f"{where} = {value} is above hetero's limit of {bound} for {what}: a corrupt or "
                               "hostile file (no released model comes near)")
    return value


def model_root(folder: Path) -> Path:
    """The folder a model's files may resolve into: the folder itself, or for a Hugging Face cache snapshot
    (``models--org--name/snapshots/<rev>``, whose files link to ``../../blobs``) the repository folder."""
    real = folder.resolve()
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return real.parent.parent
    return real


def checked_file(path: Path, max_bytes: int, root: Path | None = None) -> int:
    """Open ``path`` for reading after checking it is a regular file of at most ``max_bytes`` (inside ``root`` once
    symlinks are resolved, when given). Returns the descriptor (the caller closes it). Opened non-blocking so a
    FIFO cannot block, and checked with ``fstat`` on that descriptor so a swap after the check changes nothing."""
    if root is not None:
        real = path.resolve()
        if not real.is_relative_to(root):
            raise ModelFormatError(f"{path} resolves to {real}, outside the model folder {root}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ModelFormatError(f"{path} does not exist (cannot open it)") from None
    except OSError as exc:
        raise ModelFormatError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ModelFormatError(f"{path} is not a regular file (a FIFO, device or directory): refused")
        if info.st_size > max_bytes:
            raise ModelFormatError(f"{path} is {info.st_size} bytes; hetero reads at most {max_bytes} from it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: Path, max_bytes: int, root: Path | None = None) -> bytes:
    """The whole of a small regular file, never more than ``max_bytes`` (a file growing while read is cut off)."""
    fd = checked_file(path, max_bytes, root)
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ModelFormatError(f"{path} grew past {max_bytes} bytes while read")
    return data


def read_text(path: Path, max_bytes: int, root: Path | None = None) -> str:
    try:
        return read_bytes(path, max_bytes, root).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelFormatError(f"{path} is not UTF-8 text: {exc}") from None


def parse_json(text: str | bytes, where: str) -> Any:
    """JSON with its nesting bounded (``MAX_JSON_DEPTH``) and no huge integers or NaN surprises left to callers:
    a recursion, integer or syntax problem is a ModelFormatError naming ``where``."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ModelFormatError(f"{where}: JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and integers beyond Python's digit limit
        raise ModelFormatError(f"{where} is not valid JSON: {exc}") from None
    depth = _depth(data)
    if depth > MAX_JSON_DEPTH:
        raise ModelFormatError(f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep: refused")
    return data


def _depth(value: Any) -> int:
    """Nesting depth without recursion (the parser accepted it, a recursive walk might not)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:
                stack.extend((v, depth + 1) for v in item)
    return deepest


def read_json(path: Path, max_bytes: int = MAX_JSON_BYTES, root: Path | None = None) -> dict[str, Any]:
    """A JSON object from a small regular file (see ``checked_file`` and ``parse_json``)."""
    data = parse_json(read_bytes(path, max_bytes, root), str(path))
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path}: expected a JSON object")
    return data


class MappedFiles:
    """The files whose pages a loaded model may still read (memory-mapped weights), watched for truncation.

    A memory-mapped file that shrinks under a live model turns the next read of a lost page into SIGBUS, which kills
    the process: Python cannot catch it, and a handler that jumps out of native kernels would leave them in an
    undefined state. So the fault is *avoided*, not caught: each file is kept open and its size is checked
    (``fstat``, ~1 us a file) before every step runs, and a file that shrank since loading is a ModelFormatError
    naming it. A file replaced by a new one (``mv``, what downloaders and converters do) is harmless: the map keeps
    the old inode. What remains is the race of a truncation *during* one step, which no user-space check closes.
    """

    def __init__(self, paths: list[Path]) -> None:
        self.files: list[tuple[Path, int, int]] = []
        for path in dict.fromkeys(paths):
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                continue  # not there any more: nothing maps it
            self.files.append((path, fd, os.fstat(fd).st_size))

    def check(self) -> None:
        for path, fd, size in self.files:
            now = os.fstat(fd).st_size
            if now < size:
                raise ModelFormatError(f"{path} was truncated after loading ({size} -> {now} bytes): reading its "
                                       "mapped weights would crash the process (SIGBUS)", hint="load the model again")

    def close(self) -> None:
        for _, fd, _ in self.files:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.files = []
