"""The 8-bit one-row quantized GEMV tiles of the built plugin issue their weight prefetch (llm_impl.hpp,
prefetch_record; the 4/5/6-bit one-row tiles hold none, by design, their tiles of 2+ rows do), and q6_k's one-row
tiles their activations' L1 prefetch (prefetch_x).

A prefetch has no effect the compiler can see: with the helper (or the traits' prefetch functions) left out of line,
GCC 12 judged the calls free of side effects and deleted every one, and no decode tile prefetched whatever
HETERO_LLM_PF said -- the outputs were right, so only the machine code shows it. Reads the plugin's own symbols and
disassembly (binutils' nm and objdump; skipped without them or off x86-64)."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess

import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not (shutil.which("nm") and shutil.which("objdump")),
    reason="needs an x86-64 build and binutils (nm, objdump)",
)

# qgemm_mr<S, BITS = 8, ASYM, KQ = 0, MR = 1, NT = 8>: the 8-bit one-row tile of blocks of 32 (q8_0), per ISA
ONE_ROW = re.compile(r"qgemm_mr<\(anonymous namespace\)::(LlmSimd\w*), 8, (true|false), 0, 1, 8>")
# qgemm_mr<S, BITS = 6, ASYM = false, KQ = 2, MR = 1, NT = 4>: q6_k's one-row tile, per ISA
Q6K_ONE_ROW = re.compile(r"qgemm_mr<\(anonymous namespace\)::(LlmSimd\w*), 6, false, 2, 1, 4>")
# q4_k's (BITS = 4, ASYM, KQ = 1) row tiles: qgemm_mr<S, 4, true, 1, MR[, NT]> and qgemm_wide<S, 4, true, 1, MR>
Q4K_TILES = re.compile(r"qgemm_(?:mr|wide)<\(anonymous namespace\)::(LlmSimd\w*), 4, true, 1, (\d+)(?:, \d+)?>")


def one_row_tiles(so: str, pattern: re.Pattern[str] = ONE_ROW) -> dict[str, tuple[str, int, int]]:
    """demangled name -> (its ISA's traits, address, size) of every tile in the library that pattern names."""
    out = subprocess.run(["nm", "-C", "-S", so], check=True, capture_output=True, text=True).stdout
    tiles = {}
    for line in out.splitlines():
        parts = line.split(maxsplit=3)
        found = pattern.search(parts[3]) if len(parts) == 4 else None
        if found:
            tiles[parts[3]] = (found.group(1), int(parts[0], 16), int(parts[1], 16))
    return tiles


def prefetches(so: str, start: int, size: int, levels: str = "01") -> int:
    """prefetcht0 / prefetcht1 instructions (those of levels) in [start, start + size) of the library's code."""
    out = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", f"--start-address={start}", f"--stop-address={start + size}", so],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return len(re.findall(rf"\sprefetcht[{levels}]\s", out))


def test_8bit_one_row_tiles_issue_weight_prefetches():
    so = _native.__file__
    tiles = one_row_tiles(so)
    if not tiles:
        pytest.skip(f"{so} has no symbol table (stripped; plugins/cpu/pyproject.toml keeps it: install.strip = false)")
    isas = {isa for isa, _, _ in tiles.values()}
    assert {"LlmSimd", "LlmSimdVnni"} <= isas, sorted(isas)  # AVX-512 and VNNI tables at least (AVX2's is LlmSimd too)
    missing = [name for name, (_, at, size) in tiles.items() if prefetches(so, at, size) == 0]
    assert not missing, f"{len(missing)} of {len(tiles)} one-row tiles issue no prefetch: {missing[:3]}"


def test_q6k_one_row_tiles_issue_activation_prefetches():
    """q6_k's one-row tiles request each record's activations into L1 (prefetcht0, llm_impl.hpp: prefetch_x); q6_k
    holds no weight prefetch, so any prefetcht0 there is that one."""
    so = _native.__file__
    tiles = one_row_tiles(so, Q6K_ONE_ROW)
    if not tiles:
        pytest.skip(f"{so} has no symbol table (stripped; plugins/cpu/pyproject.toml keeps it: install.strip = false)")
    isas = {isa for isa, _, _ in tiles.values()}
    assert {"LlmSimd", "LlmSimdVnni"} <= isas, sorted(isas)
    missing = [name for name, (_, at, size) in tiles.items() if prefetches(so, at, size, levels="0") == 0]
    assert not missing, f"{len(missing)} of {len(tiles)} q6_k one-row tiles issue no activation prefetch: {missing[:3]}"


def _tile_rows(name: str) -> int:
    found = Q4K_TILES.search(name)
    assert found, name
    return int(found.group(2))


def test_4bit_tiles_prefetch_only_with_several_rows():
    """q4_k's VNNI tiles of 2+ rows (a verify step) hold the weight prefetch (8 KiB ahead by default from 8 rows,
    HETERO_LLM_PF_ROWS), its one-row tile none: deleted by the compiler, the verify tiles would silently stream as
    before."""
    so = _native.__file__
    tiles = one_row_tiles(so, Q4K_TILES)
    if not tiles:
        pytest.skip(f"{so} has no symbol table (stripped; plugins/cpu/pyproject.toml keeps it: install.strip = false)")
    # the VNNI tables' tiles (the generic table's traits, also named LlmSimd, prefetch nothing: no x86 intrinsics)
    tiles = {name: tile for name, tile in tiles.items() if tile[0] in ("LlmSimdVnni", "LlmSimdVbmi")}
    assert tiles, "no q4_k tile of the VNNI tables"
    rows = {name: _tile_rows(name) for name in tiles}
    one = [name for name, (_, at, size) in tiles.items() if rows[name] == 1 and prefetches(so, at, size, "1") > 0]
    assert not one, f"one-row q4_k tiles with a prefetch: {one[:3]}"
    several = [name for name in tiles if rows[name] >= 2]
    assert several
    # the 4-row tile prefetches into L1 (prefetcht0, llm_impl.hpp rows_into_l1), the others into L2 (prefetcht1)
    missing = [
        name for name in several if prefetches(so, tiles[name][1], tiles[name][2], "0" if rows[name] == 4 else "1") == 0
    ]
    assert not missing, f"{len(missing)} of {len(several)} q4_k row tiles issue no prefetch: {missing[:3]}"
