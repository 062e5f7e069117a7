"""``hetero eval needle`` (hetero.llm.needle, heatmap, needle_cli) on the tiny fixtures: they answer at random, so
these test the machinery: the prompt's length and the needle's depth in tokens, scoring, the table, the PNG, the
option errors. A slow test runs a real model (HETERO_NEEDLE_MODEL) and expects it to find the needle."""

from __future__ import annotations

import os
import random
import struct
import zlib
from pathlib import Path

import pytest

from hetero.cli import main
from hetero.contract import HeteroError
from hetero.llm.heatmap import CELL_H, CELL_W, LABEL_W, Panel, colour, render
from hetero.llm.needle import (
    Grid,
    Needle,
    Prompter,
    Trial,
    build_case,
    haystack_sentences,
    make_needles,
    needle_depths,
    question,
    score,
    table,
)

from .helpers import FIXTURES, load

# e.g. Qwen2.5-Coder-1.5B in GGUF; opt-in: a 1.5B model takes minutes on a busy CPU
REAL_MODEL = os.environ.get("HETERO_NEEDLE_MODEL", "")


@pytest.fixture(scope="module")
def prompter():
    return Prompter(load(FIXTURES / "qwen3", context=2048))


@pytest.fixture(scope="module")
def sentences():
    return haystack_sentences()[0]


def haystack_tokens_before(prompter: Prompter, document: str, fact: str) -> tuple[int, int]:
    """Tokens of the haystack before ``fact`` and in all (the needles' own tokens left out)."""
    head, _, tail = document.partition(fact)
    return prompter.count(head), prompter.count(head) + prompter.count(tail)


@pytest.mark.parametrize("template", ["chat", "plain"])
@pytest.mark.parametrize("length", [300, 700])
@pytest.mark.parametrize("depth", [0.0, 30.0, 100.0])
def test_prompt_length_and_needle_depth_in_tokens(prompter, sentences, template, length, depth):
    prompter = Prompter(prompter.llm, template)
    needle = make_needles(1, random.Random(1))
    case = build_case(prompter, sentences, length, depth, needle)
    longest = max(prompter.count(s) for s in sentences[:40])
    assert length - longest - 4 <= len(case.ids) <= length
    assert case.ids == prompter.ids(case.document, case.question)
    assert (prompter.llm.detokenize(case.ids).startswith("<|im_start|>")) == (template == "chat")
    before, total = haystack_tokens_before(prompter, case.document, needle[0].fact)
    assert abs(before - depth / 100 * total) <= longest  # the boundary nearest the depth
    assert case.document.count("secret number") == 1


def test_multi_needles_spread_after_the_depth(prompter, sentences):
    needles = make_needles(3, random.Random(7))
    assert needle_depths(40.0, 3) == [40.0, 60.0, 80.0]
    case = build_case(prompter, sentences, 900, 40.0, needles)
    positions = [case.document.index(n.fact) for n in needles]
    assert positions == sorted(positions) and len(case.ids) <= 900
    for n, depth in zip(needles, needle_depths(40.0, 3), strict=True):
        before = prompter.count(case.document[:case.document.index(n.fact)])
        assert abs(before / prompter.count(case.document) - depth / 100) < 0.2
    assert all(n.subject in case.question for n in needles)


def test_compressed_case_keeps_the_needle(prompter, sentences):
    needles = make_needles(1, random.Random(3))
    case = build_case(prompter, sentences, 1500, 50.0, needles, compress=0.3)
    assert needles[0].fact in case.document
    assert prompter.count(case.document) <= round(0.3 * case.compressed_from)
    assert len(case.ids) < 0.6 * 1500


def test_needles_are_seeded_and_distinct():
    a, b = make_needles(5, random.Random("x")), make_needles(5, random.Random("x"))
    assert a == b and len({n.subject for n in a}) == 5
    assert all(len(n.answer) == 6 and n.answer.isdigit() for n in a)


def test_score():
    needles = [Needle("amber river", "123456"), Needle("jade tower", "654321")]
    assert score("The amber river: 123456; jade tower: 654321.", needles) == 1.0
    assert score("123456", needles) == 0.5
    assert score("1234567 and 6543210", needles) == 0.0  # a longer number is not the answer
    assert score("", needles[:1]) == 0.0
    assert "amber river" in question(needles[:1]) and "jade tower" in question(needles)


def test_table_rows_columns_and_means():
    grid = Grid("kv f16", [512, 1024], [0.0, 50.0])
    for length, depth, s in [(512, 0.0, 1.0), (512, 50.0, 0.0), (1024, 0.0, 1.0), (1024, 0.0, 0.0)]:
        grid.trials.append(Trial(length, depth, length, s, ""))
    lines = table(grid).splitlines()
    assert lines[0] == "| tokens | 0% | 50% | mean |"
    assert lines[2] == "| 512 | 100 | 0 | 50 |"
    assert lines[3] == "| 1024 | 50 | - | 50 |"
    assert lines[4] == "| mean | 67 | 0 | 50 |"


def read_png(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and RGB pixels of an 8-bit RGB PNG, every chunk's CRC checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + size]
        assert struct.unpack(">I", data[pos + 8 + size:pos + 12 + size])[0] == zlib.crc32(kind + body)
        chunks.append((kind, body))
        pos += 12 + size
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    width, height, depth, kind, _, _, _ = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, kind) == (8, 2)
    raw = zlib.decompress(chunks[1][1])
    assert len(raw) == height * (1 + 3 * width)
    rows = [raw[r * (1 + 3 * width):(r + 1) * (1 + 3 * width)] for r in range(height)]
    assert all(row[0] == 0 for row in rows)
    return width, height, b"".join(row[1:] for row in rows)


def test_heatmap_png_is_valid_and_coloured():
    panels = [Panel(["512", "1024"], ["0", "50", "100"], [[1.0, 0.0, None], [0.5, 1.0, 0.0]]),
              Panel(["512"], ["0"], [[0.0]])]
    width, height, pixels = read_png(render(panels))
    assert width == LABEL_W + 3 * CELL_W + 4 and height == 3 * CELL_H + 2 * CELL_H + CELL_H // 2 + 4

    def pixel(x: int, y: int) -> tuple[int, ...]:
        return tuple(pixels[(y * width + x) * 3:(y * width + x) * 3 + 3])

    corner = (LABEL_W + 3, 2 + CELL_H + 3)  # a cell's top-left inside its border, clear of the printed value
    assert pixel(*corner) == colour(1.0)
    assert pixel(corner[0] + CELL_W, corner[1]) == colour(0.0)
    assert pixel(corner[0] + 2 * CELL_W, corner[1]) == (200, 200, 200)  # not measured
    assert colour(0.0)[0] > colour(0.0)[1] and colour(1.0)[1] > colour(1.0)[0]
    pil = pytest.importorskip("PIL.Image", reason="Pillow not installed: the PNG was checked by hand only")
    import io

    with pil.open(io.BytesIO(render(panels))) as image:
        assert image.size == (width, height) and image.mode == "RGB"


def test_cli_prints_the_tables_and_writes_the_heatmap(tmp_path, capsys):
    png = tmp_path / "needle.png"
    code = main(["eval", "needle", str(FIXTURES / "qwen3"), "-l", "300,500", "-d", "0,100", "--compress", "0.5",
                 "--kv-cache", "f16,q8", "--heatmap", str(png), "-n", "2", "--needles", "2", "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    labels = ["kv f16, uncompressed", "kv f16, compressed to 0.5", "kv q8, uncompressed", "kv q8, compressed to 0.5"]
    assert all(f"\n{label}\n" in out for label in labels)
    assert out.count("| tokens | 0% | 100% | mean |") == 4 and out.count("\n| 300 | ") == 4
    width, height, _ = read_png(png.read_bytes())
    assert width == LABEL_W + 2 * CELL_W + 4 and height == 4 * 3 * CELL_H + 3 * (CELL_H // 2) + 4


@pytest.mark.parametrize(("flags", "message"), [
    (["-d", "0,150"], "within 0..100"),
    (["-l", "512,abc"], "comma-separated numbers"),
    (["-l", "8"], "at least 16 tokens"),
    (["-l", "40"], "cannot hold the instructions"),
    (["--kv-cache", "q4"], "expected some of f16, f32, q8"),
    (["--compress", "2"], "share between 0 and 1"),
    (["--compress-only"], "needs --compress"),
    (["--heatmap", "map.jpg"], "is a .png file"),
    (["--needles", "0"], "expected 1..20"),
    (["--haystack", "/nonexistent/hay.txt"], "cannot read it"),
])
def test_bad_options_are_one_line_errors(flags, message, capsys):
    code = main(["eval", "needle", str(FIXTURES / "qwen3"), "-n", "1", "--quiet", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_prompter_refuses_chat_without_a_template():
    class NoTemplate:
        name, template = "bare", None

    with pytest.raises(HeteroError, match="no chat template"):
        Prompter(NoTemplate(), "chat")
    with pytest.raises(HeteroError, match="expected auto, chat or plain"):
        Prompter(NoTemplate(), "jinja")


@pytest.mark.slow
@pytest.mark.skipif(not Path(REAL_MODEL).is_file(),
                    reason="no real model: set HETERO_NEEDLE_MODEL to a GGUF file or model folder of an instruct model")
def test_real_model_finds_the_needle(capsys):
    code = main(["eval", "needle", REAL_MODEL, "-l", "512", "-d", "25,75", "-n", "12", "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    assert "| 512 | 100 | 100 | 100 |" in out, out
