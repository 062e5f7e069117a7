"""benchmarks/qgemm_ksweep.py runs end to end on a tiny sweep (it must keep working against the plugin's API)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import load_script

pytest.importorskip("hetero_cpu._native", reason="the hetero-cpu native extension is not built")

ROOT = Path(__file__).resolve().parents[3]


def test_tiny_sweep(monkeypatch, capsys):
    bench = load_script(ROOT / "benchmarks" / "qgemm_ksweep.py", "qgemm_ksweep_bench")
    argv = ["qgemm_ksweep.py", "--k", "256,512", "--nk", "8192", "--copies", "1", "--passes", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["q4_k K=256 N=32", "q4_k K=512 N=16"]
    assert all("M=2" in ln and "paired" in ln for ln in lines)
