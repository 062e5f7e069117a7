"""benchmarks/llm.py --llama-bench PATH: llama.cpp run as a natively built llama-bench binary instead of through
llama-cpp-python. A failing binary gives the row an error naming llama-bench (not a crash); with a real build
(``HETERO_LLAMA_BENCH=/path/to/llama-bench``) its JSON samples become the run's pp / tg tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def bench_llm():
    return load_script(ROOT / "benchmarks" / "llm.py", "llm_bench_binary_under_test")


def test_failing_binary_is_an_error_row(tmp_path):
    failing = shutil.which("false")
    if failing is None:
        pytest.skip("no 'false' program on this machine")
    out = bench_llm().run_llama_bench(Path(failing), tmp_path / "none.gguf", 1, 1, 8, 4, timeout=30)
    assert set(out) == {"error"}
    assert out["error"].startswith("llama-bench exit 1")


def test_real_llama_bench_samples_become_the_tests(tmp_path):
    binary = os.environ.get("HETERO_LLAMA_BENCH")
    if not binary or not Path(binary).is_file():
        pytest.skip("set HETERO_LLAMA_BENCH to a natively built llama-bench to run this")
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from llm.helpers import FIXTURES, gguf_writer

    path = tmp_path / "qwen2-q8_0.gguf"
    gguf_writer().convert(FIXTURES / "qwen2", path, "Q8_0")
    out = bench_llm().run_llama_bench(Path(binary), path, 1, 2, 8, 4, timeout=120)
    assert "error" not in out, out
    assert sorted(out["tests"]) == ["pp8", "tg4"]
    assert all(len(s) == 2 and all(x > 0 for x in s) for s in out["tests"].values())
    assert out["info"]["build_commit"]
