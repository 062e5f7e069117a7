"""Accuracy heat maps as PNG files, written with zlib alone (no imaging library).

A panel is a grid of cells coloured from red (0 %) through yellow to green (100 %), the value printed in each cell
and the row / column labels (numbers) beside it, in a 3x5 pixel digit font scaled up. Several panels stack
vertically, in the order given, separated by a grey band.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..contract.errors import HeteroError

# 3x5 glyphs, one string of 15 bits per character (rows top to bottom)
_GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", "-": "000000111000000", ".": "000000000000010",
    "k": "100101110101101", " ": "000000000000000",
}
SCALE = 2  # pixels per font pixel
CELL_W, CELL_H = 40, 24
LABEL_W = 40  # left margin for the row labels
WHITE, GREY, BLACK = (255, 255, 255), (200, 200, 200), (0, 0, 0)


@dataclass
class Panel:
    """One grid: ``values[r][c]`` in [0, 1] (None: not measured, drawn grey)."""

    rows: Sequence[str]
    columns: Sequence[str]
    values: Sequence[Sequence[float | None]]


def colour(value: float) -> tuple[int, int, int]:
    """Red (0) -> yellow (0.5) -> green (1)."""
    v = min(max(value, 0.0), 1.0)
    if v < 0.5:
        return 230, int(60 + 2 * v * 170), 60
    return int(230 - (v - 0.5) * 2 * 170), 200, 60


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(WHITE) * (width * height))

    def fill(self, x: int, y: int, w: int, h: int, rgb: tuple[int, int, int]) -> None:
        row = bytes(rgb) * w
        for yy in range(max(y, 0), min(y + h, self.height)):
            start = (yy * self.width + x) * 3
            self.pixels[start:start + len(row)] = row

    def text(self, x: int, y: int, text: str, rgb: tuple[int, int, int] = BLACK) -> None:
        for k, ch in enumerate(text):
            bits = _GLYPHS.get(ch, _GLYPHS[" "])
            for i, bit in enumerate(bits):
                if bit == "1":
                    self.fill(x + (k * 4 + i % 3) * SCALE, y + (i // 3) * SCALE, SCALE, SCALE, rgb)

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.pixels[r * self.width * 3:(r + 1) * self.width * 3])
                       for r in range(self.height))
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
        return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9)) + \
            _chunk(b"IEND", b"")


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def text_width(text: str) -> int:
    return len(text) * 4 * SCALE - SCALE


def _centred(canvas: Canvas, x: int, y: int, w: int, h: int, text: str) -> None:
    canvas.text(x + (w - text_width(text)) // 2, y + (h - 5 * SCALE) // 2, text)


def render(panels: Sequence[Panel]) -> bytes:
    """The PNG bytes of ``panels`` stacked vertically."""
    if not panels:
        raise HeteroError("heat map: no panels to draw")
    columns = max(len(p.columns) for p in panels)
    heights = [(len(p.rows) + 1) * CELL_H for p in panels]
    gap = CELL_H // 2
    canvas = Canvas(LABEL_W + columns * CELL_W + 4, sum(heights) + gap * (len(panels) - 1) + 4)
    y = 2
    for panel, height in zip(panels, heights, strict=True):
        for c, label in enumerate(panel.columns):
            _centred(canvas, LABEL_W + c * CELL_W, y, CELL_W, CELL_H, label)
        for r, label in enumerate(panel.rows):
            top = y + (r + 1) * CELL_H
            _centred(canvas, 0, top, LABEL_W, CELL_H, label)
            for c in range(len(panel.columns)):
                value = panel.values[r][c]
                left = LABEL_W + c * CELL_W
                canvas.fill(left + 1, top + 1, CELL_W - 2, CELL_H - 2, GREY if value is None else colour(value))
                if value is not None:
                    _centred(canvas, left, top, CELL_W, CELL_H, str(round(100 * value)))
        y += height
        if panel is not panels[-1]:
            canvas.fill(0, y + gap // 2 - 1, canvas.width, 2, GREY)
            y += gap
    return canvas.png()


def write_heatmap(path: str | Path, panels: Sequence[Panel]) -> Path:
    path = Path(path)
    data = render(panels)
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise HeteroError(f"heat map {path}: cannot write it ({exc.strerror or exc})") from exc
    return path


__all__ = ["Panel", "render", "write_heatmap"]
