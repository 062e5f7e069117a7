"""benchmarks/llm.py's bandwidth bound in the decode run's own memory phase: each engine's run is bracketed by read
probes at its thread count, its "% of bound" is against their median (not the probe taken at the session's start,
which on this VM can be in another phase), and the table prints the probes so that a phase change shows."""

from __future__ import annotations

from pathlib import Path

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def bench_llm():
    return load_script(ROOT / "benchmarks" / "llm.py", "llm_bench_under_test")


def test_probes_taken_right_before_and_after_the_run():
    mod = bench_llm()
    events: list[str] = []
    readings = iter([30.0, 60.0])

    def probe(threads: int) -> dict[str, float]:
        events.append(f"probe {threads}")
        return {"best": next(readings)}

    def run() -> dict[str, object]:
        events.append("run")
        return {"tests": {"tg128": [10.0]}}

    out = mod.bracket_probe(2, run, probe)
    assert events == ["probe 2", "run", "probe 2"]
    assert out["probes"] == [30.0, 60.0] and out["tests"] == {"tg128": [10.0]}
    assert len(out["probe_load"]) == 2
    assert mod.run_bound(out, fallback=99.0) == 45.0  # the median of its own probes, not the start probe
    assert mod.run_bound({"tests": {}}, fallback=99.0) == 99.0


def _run(tps_tg: float, probes: list[float] | None) -> dict[str, object]:
    stats = {"pp512": {"median": 100.0, "mean": 100.0, "std": 0.0, "n": 1},
             "tg128": {"median": tps_tg, "mean": tps_tg, "std": 0.0, "n": 1}}
    run: dict[str, object] = {"stats": stats, "load_s": 1.0, "peak_rss": 2**30, "base_rss": 2**20,
                              "mem_loaded": {}, "mem_end": {}}
    if probes is not None:
        run["probes"] = probes
    return run


def test_table_percent_of_bound_uses_each_runs_probes():
    mod = bench_llm()
    per_token = 10**9  # 1 GB a token: % of bound = 100 * t/s / GB/s
    row = {"model": "m", "type": "file", "threads": 2, "file": {"file_bytes": 2**30, "bytes_per_token": per_token},
           # llama.cpp ran in the slow phase (probes 30 -> 34), hetero in the fast one (56 -> 58)
           "llama.cpp": _run(16.0, [30.0, 34.0]), "hetero": _run(28.5, [56.0, 58.0])}
    table = mod.markdown([row], {2: 57.0}, 512, 128)
    line = next(ln for ln in table.splitlines() if ln.startswith("| m |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[10] == "50 / 50"  # 16 / 32 and 28.5 / 57: each against its own median
    assert cells[11] == "30.0 -> 34.0 / 56.0 -> 58.0"
    assert cells[12] == "16.0 / 28.5"  # the GB/s each decode read: t/s x 1 GB a token, beside its probes
    assert "session start): 57.0 GB/s" in table

    row_start = dict(row, **{"llama.cpp": _run(16.0, None), "hetero": _run(28.5, None)})
    cells = [c.strip() for c in next(ln for ln in mod.markdown([row_start], {2: 40.0}, 512, 128).splitlines()
                                     if ln.startswith("| m |")).strip("|").split("|")]
    assert cells[10] == "40 / 71" and cells[11] == "— / —"  # --probe start: the session's start probe for both
