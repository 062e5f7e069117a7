"""The 8-bit one-row quantized GEMV tiles of the built plugin issue their weight prefetch (llm_impl.hpp,
prefetch_record; the 4/5/6-bit tiles hold none, by design).

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


def one_row_tiles(so: str) -> dict[str, tuple[str, int, int]]:
    """demangled name -> (its ISA's traits, address, size) of every one-row tile in the library."""
    out = subprocess.run(["nm", "-C", "-S", so], check=True, capture_output=True, text=True).stdout
    tiles = {}
    for line in out.splitlines():
        parts = line.split(maxsplit=3)
        found = ONE_ROW.search(parts[3]) if len(parts) == 4 else None
        if found:
            tiles[parts[3]] = (found.group(1), int(parts[0], 16), int(parts[1], 16))
    return tiles


def prefetches(so: str, start: int, size: int) -> int:
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={start}",
                          f"--stop-address={start + size}", so], check=True, capture_output=True, text=True).stdout
    return len(re.findall(r"\sprefetcht[01]\s", out))


def test_8bit_one_row_tiles_issue_weight_prefetches():
    so = _native.__file__
    tiles = one_row_tiles(so)
    if not tiles:
        pytest.skip(f"{so} has no symbol table (stripped; plugins/cpu/pyproject.toml keeps it: install.strip = false)")
    isas = {isa for isa, _, _ in tiles.values()}
    assert {"LlmSimd", "LlmSimdVnni"} <= isas, sorted(isas)  # AVX-512 and VNNI tables at least (AVX2's is LlmSimd too)
    missing = [name for name, (_, at, size) in tiles.items() if prefetches(so, at, size) == 0]
    assert not missing, f"{len(missing)} of {len(tiles)} one-row tiles issue no prefetch: {missing[:3]}"
