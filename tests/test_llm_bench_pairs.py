"""benchmarks/llm.py --pairs: hetero and llama.cpp resident side by side, taking turns one run at a time with the
first engine alternating, a short read probe between rounds, and the ratio reported as the median of the per-round
ratios (both engines of a round meet the same phase of the VM). The protocol logic runs on fake workers; one real
short pairing runs on a tiny GGUF made from the test fixtures (and against llama.cpp where it is installed)."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # llm.py imports its sibling resident.py this way too

from resident import Resident, WorkerError, turn_order  # noqa: E402

# A development checkout has its cpu plugin built in place; CI installs it as a wheel instead. The workers then run
# the installed plugin (llm.py's --installed), and decode_ab.py, whose arms are trees, cannot run this checkout.
BUILT_IN_PLACE = any((ROOT / "plugins" / "cpu" / "hetero_cpu").glob("_native*.so"))


def bench_llm():
    return load_script(ROOT / "benchmarks" / "llm.py", "llm_bench_pairs_under_test")


class FakeWorker:
    """Answers each test with the next of its t/s, and logs the turn."""

    def __init__(self, name: str, ts: dict[str, list[float]], events: list[str]) -> None:
        self.name, self.ts, self.events = name, {k: iter(v) for k, v in ts.items()}, events

    def ask(self, test: str, timeout: float | None = None) -> str:
        self.events.append(f"{self.name} {test}")
        return json.dumps({"ts": next(self.ts[test])})


def test_turn_order_alternates_and_probes_sit_between_rounds():
    mod = bench_llm()
    events: list[str] = []
    probes = iter([50.0, 40.0, 60.0])

    def probe() -> float:
        events.append("probe")
        return next(probes)

    workers = [FakeWorker("l", {"pp8": [1.0, 1.0], "tg4": [2.0, 2.0]}, events),
               FakeWorker("h", {"pp8": [3.0, 3.0], "tg4": [4.0, 4.0]}, events)]
    out = mod.pair_rounds(workers, ["pp8", "tg4"], 2, probe)
    assert events == ["probe", "l pp8", "h pp8", "l tg4", "h tg4", "probe",
                      "h pp8", "l pp8", "h tg4", "l tg4", "probe"]
    assert out["orders"] == [[0, 1], [1, 0]] and [list(turn_order(r)) for r in range(3)] == [[0, 1], [1, 0], [0, 1]]
    assert out["probes"] == [50.0, 40.0, 60.0]
    assert out["samples"] == {"pp8": [[1.0, 1.0], [3.0, 3.0]], "tg4": [[2.0, 2.0], [4.0, 4.0]]}


def test_ratio_is_the_median_of_the_rounds_ratios():
    mod = bench_llm()
    # five rounds; the machine's phase moves both engines together (fast, slow, fast, slow, fast): every round's
    # ratio is 1.5 but one (1.2), while the engines' medians come from different rounds
    ref = [20.0, 10.0, 20.0, 10.0, 20.0]
    sub = [30.0, 15.0, 24.0, 15.0, 30.0]
    result = {"samples": {"tg4": [ref, sub]}, "probes": [60.0, 60.0, 30.0, 30.0, 60.0, 60.0], "orders": []}
    summary = mod.pair_summary(result, bytes_per_token=10**9, decode_test="tg4")
    e = summary["tests"]["tg4"]
    assert e["ratios"] == [1.5, 1.5, 1.2, 1.5, 1.5]
    assert e["ratio"]["median"] == 1.5 and e["ratio"]["min"] == 1.2 and e["ratio"]["max"] == 1.5
    assert e["ratio"]["q1"] == 1.5 and e["ratio"]["q3"] == 1.5
    assert e["median"] == [20.0, 24.0] and e["ratio_of_medians"] == pytest.approx(1.2)
    # % of bound: each round against the mean of its two probes (60, 45, 30, 45, 60 GB/s at 1 GB a token)
    bounds = mod.round_bounds(result["probes"], 5)
    assert bounds == [60.0, 45.0, 30.0, 45.0, 60.0]
    expected_ref = sorted(100 * t / b for t, b in zip(ref, bounds, strict=True))[2]
    assert e["pct_of_bound"][0] == pytest.approx(expected_ref)
    assert summary["probes"]["min"] == 30.0 and summary["probes"]["max"] == 60.0
    assert mod.round_bounds([], 5) is None
    assert "pct_of_bound" not in mod.pair_summary({**result, "probes": []}, 10**9, "tg4")["tests"]["tg4"]


def test_markdown_columns():
    mod = bench_llm()
    result = {"samples": {"pp8": [[100.0, 110.0], [200.0, 210.0]], "tg4": [[10.0, 20.0], [15.0, 26.0]]},
              "probes": [40.0, 50.0, 60.0], "orders": [[0, 1], [1, 0]]}
    row = {"model": "m", "type": "file", "threads": 2, "pair": result,
           "summary": mod.pair_summary(result, 10**9, "tg4")}
    failed = {"model": "m2", "type": "file", "threads": 1, "pair": {"error": "hetero worker exited (status 1)"}}
    lines = mod.paired_markdown([row, failed]).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head == ["model", "type", "thr", "rounds", "test", "llama.cpp t/s", "hetero t/s",
                    "ratio: median of rounds", "ratio min-max", "ratio IQR", "ratio of medians",
                    "% of BW bound (l / h)", "round probes GB/s", "read GB/s (l / h)", "own probes GB/s (l / h)",
                    "% of own-probe bound (l / h)", "same, probes agree (l / h)", "phase changed (l / h)"]
    assert lines[1].count("|") == len(head) + 1
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:5]]
    assert all(len(r) == len(head) for r in rows)
    pp, tg, err = rows
    assert pp[:7] == ["m", "file", "2", "2", "pp8", "105.0", "205.0"] and pp[11] == "—" and pp[13:] == ["—"] * 5
    # % of bound: the rounds at 45 and 55 GB/s (the means of their probes): 10/45, 20/55 and 15/45, 26/55
    assert tg[4:12] == ["tg4", "15.0", "20.5", "1.40", "1.30-1.50", "1.35-1.45", "1.37", "29 / 40"]
    assert tg[12] == "40.0-60.0 (median 50.0)"
    # read GB/s: the median t/s x 1 GB a token; no run was bracketed by its own probes (--probe start)
    assert tg[13:] == ["15.0 / 20.5", "—", "—", "—", "—"]
    assert err[:3] == ["m2", "file", "1"] and err[5] == "error: hetero worker exited (status 1)"
    assert "Each decode run between its own probes" not in "\n".join(lines)


def test_each_decode_run_sits_between_its_own_probes():
    mod = bench_llm()
    events: list[str] = []
    round_probes = iter([50.0, 40.0, 60.0])
    readings = iter([31.0, 32.0, 58.0, 57.0, 56.0, 36.0])

    def probe() -> float:
        events.append("probe")
        return next(round_probes)

    def run_probe() -> dict[str, float]:
        events.append("run probe")
        best = next(readings)
        return {"best": best, "best_cpu": best + 1}

    workers = [FakeWorker("l", {"pp8": [1.0, 1.0], "tg4": [2.0, 3.0]}, events),
               FakeWorker("h", {"pp8": [3.0, 3.0], "tg4": [4.0, 5.0]}, events)]
    out = mod.pair_rounds(workers, ["pp8", "tg4"], 2, probe, run_probe=run_probe, probed_test="tg4")
    # a probe right before and right after each tg run; the one between the engines is the first one's "after"
    # and the second one's "before" (nothing runs between them); none around the prefill runs
    assert events == ["probe", "l pp8", "h pp8", "run probe", "l tg4", "run probe", "h tg4", "run probe", "probe",
                      "h pp8", "l pp8", "run probe", "h tg4", "run probe", "l tg4", "run probe", "probe"]
    # round 1 (l then h): 31 | l | 32 | h | 58; round 2 (h then l): 57 | h | 56 | l | 36
    assert out["run_probes"] == [[[31.0, 32.0], [56.0, 36.0]], [[32.0, 58.0], [57.0, 56.0]]]
    assert out["run_probes_cpu"] == [[[32.0, 33.0], [57.0, 37.0]], [[33.0, 59.0], [58.0, 57.0]]]
    assert out["probes"] == [50.0, 40.0, 60.0] and out["samples"]["tg4"] == [[2.0, 3.0], [4.0, 5.0]]
    # without run_probe (--probe start), or when the decode test is not run: the probes between rounds only
    events.clear()
    plain = mod.pair_rounds([FakeWorker("l", {"pp8": [1.0]}, events), FakeWorker("h", {"pp8": [2.0]}, events)],
                            ["pp8"], 1, None, run_probe=run_probe, probed_test="tg4")
    assert "run_probes" not in plain and events == ["l pp8", "h pp8"]


def _fake(script: str) -> list[str]:
    return [sys.executable, "-c", script]


def test_a_worker_that_dies_gives_its_status_and_stderr():
    worker = Resident("fake", _fake("import sys; print('ready {}', flush=True); sys.stdin.readline(); "
                                    "sys.stderr.write('kernel exploded\\n'); sys.exit(3)"), ready_timeout=60)
    assert worker.ready == "{}"
    with pytest.raises(WorkerError, match=r"fake worker exited \(status 3\).*kernel exploded"):
        worker.ask("tg4", timeout=60)
    worker.close()


def test_a_silent_worker_times_out_and_is_killed():
    worker = Resident("slow", _fake("import sys, time; print('ready', flush=True); sys.stdin.readline(); "
                                    "time.sleep(600)"), ready_timeout=60)
    with pytest.raises(WorkerError, match="no answer to 'tg4' within 1 s"):
        worker.ask("tg4", timeout=1)
    assert worker.proc.poll() is not None  # killed, not left running
    worker.close()


def test_a_worker_that_never_gets_ready():
    with pytest.raises(WorkerError, match=r"exited \(status 2\) waiting for its ready line.*no such model"):
        Resident("bad", _fake("import sys; print('loading ...', flush=True); sys.stderr.write('no such model\\n'); "
                              "sys.exit(2)"), ready_timeout=60)


def test_run_paired_reports_a_dead_worker_as_the_rows_error(monkeypatch, tmp_path):
    mod = bench_llm()
    scripts = {"llama.cpp": "import sys; print('ready {}', flush=True)\nfor _ in sys.stdin: print('{\"ts\": 1.0}', "
                            "flush=True)",
               "hetero": "import sys; print('ready {}', flush=True); sys.stdin.readline(); "
                         "sys.stderr.write('Segmentation fault\\n'); sys.exit(139)"}
    monkeypatch.setattr(mod, "_worker_cmd", lambda runtime, *a, **k: _fake(scripts[runtime]))
    out = mod.run_paired(["llama.cpp", "hetero"], tmp_path / "x.gguf", 2, 3, 8, 4, True, timeout=60)
    assert "hetero worker exited (status 139)" in out["error"] and "Segmentation fault" in out["error"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    pytest.importorskip("gguf", reason="the gguf package (the GGUF writer of the test fixtures) is absent")
    writer = load_script(ROOT / "scripts" / "make_gguf_fixtures.py", "make_gguf_fixtures", shared=True)
    path = tmp_path_factory.mktemp("pairs") / "qwen2-f16.gguf"
    writer.convert(ROOT / "tests" / "fixtures" / "llm" / "qwen2", path, "F16")
    return path


def _check_real_pairing(runtimes: list[str], path: Path) -> None:
    mod = bench_llm()
    out = mod.run_paired(runtimes, path, 1, 2, 8, 4, not BUILT_IN_PLACE, timeout=300, probe=lambda: 10.0,
                         run_probe=lambda: {"best": 20.0})
    assert "error" not in out, out.get("error")
    assert out["orders"] == [[0, 1], [1, 0]] and out["probes"] == [10.0, 10.0, 10.0]
    assert out["run_probes"] == [[[20.0, 20.0]] * 2] * 2  # around each engine's tg4 run of each round
    assert "run_probes_cpu" not in out  # the probe gave no CPU-clock figure
    summary = mod.pair_summary(out, 10**6, "tg4")
    for test in ("pp8", "tg4"):
        assert all(len(s) == 2 and all(t > 0 and math.isfinite(t) for t in s) for s in out["samples"][test])
        assert len(summary["tests"][test]["ratios"]) == 2
    hetero = out["loaded"][runtimes.index("hetero")]["info"]
    if BUILT_IN_PLACE:  # this checkout's plugin, not an installed one
        assert Path(hetero["hetero_cpu"]).resolve().is_relative_to(ROOT)


def test_real_pairing_hetero_against_hetero(tiny_gguf):
    _check_real_pairing(["hetero", "hetero"], tiny_gguf)


def test_real_pairing_llama_cpp_against_hetero(tiny_gguf):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is absent: the llama.cpp worker cannot run")
    _check_real_pairing(["llama.cpp", "hetero"], tiny_gguf)


@pytest.mark.skipif(not BUILT_IN_PLACE, reason="the checkout's cpu plugin is not built in place "
                    "(plugins/cpu/hetero_cpu/_native*.so): decode_ab.py's arms are source trees with their own build")
def test_decode_ab_still_pairs_two_resident_workers(tiny_gguf):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_ab.py"), str(tiny_gguf), str(ROOT),
                           "--threads", "1", "--blocks", "2", "--steps", "2", "--json", "--timeout", "300"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["logits_identical"] and summary["blocks"] == 2 and summary["ratio_median"] > 0


def _bracketed_result() -> dict:
    # 1 GB a token: % of bound = 100 * t/s / GB/s. llama.cpp's run 2 and every hetero run met a phase change
    # (probes > 15 % apart, either way round); llama.cpp's run 3 (30 -> 34: 13 %) did not
    return {"samples": {"tg4": [[10.0, 20.0, 13.0], [30.0, 33.6, 28.0]]}, "probes": [40.0, 50.0, 45.0, 35.0],
            "orders": [[0, 1], [1, 0], [0, 1]],
            "run_probes": [[[40.0, 40.0], [40.0, 60.0], [30.0, 34.0]], [[40.0, 60.0], [60.0, 52.0], [34.0, 40.0]]],
            "run_probes_cpu": [[[41.0, 41.0], [61.0, 61.0], [31.0, 35.0]],
                               [[61.0, 61.0], [61.0, 53.0], [35.0, 41.0]]]}


def test_each_run_against_its_own_probes_and_the_phase_flag():
    mod = bench_llm()
    result = _bracketed_result()
    ref, sub = result["samples"]["tg4"]
    runs = mod.bracketed_runs(ref, result["run_probes"][0], 10**9)
    assert [r["bound"] for r in runs] == [40.0, 50.0, 32.0]
    assert [r["spread"] for r in runs] == pytest.approx([0.0, 0.5, 34 / 30 - 1])
    assert [r["phase_changed"] for r in runs] == [False, True, False]
    assert [r["pct"] for r in runs] == pytest.approx([25.0, 40.0, 40.625])
    assert [r["read_gbs"] for r in runs] == [10.0, 20.0, 13.0] and runs[1]["probes"] == [40.0, 60.0]
    assert all(r["cpu_probes"] is None and r["lost_cpu"] is None for r in runs)
    # by CPU time 15 % faster than by the wall clock is still the CPU's; more: the probe lost the CPU
    lost = mod.bracketed_runs([1.0, 1.0], [[40.0, 40.0], [40.0, 40.0]], 1, [[45.0, 40.0], [40.0, 47.0]])
    assert [r["lost_cpu"] for r in lost] == [False, True]
    own = mod.own_bound_summary(runs)
    assert own["pct"] == pytest.approx(40.0) and own["pct_steady"] == pytest.approx((25.0 + 40.625) / 2)
    assert own["read_gbs"] == 13.0 and own["bound"] == 40.0 and own["spread_max"] == 0.5
    assert own["phase_changed"] == 1 and own["n"] == 3 and own["lost_cpu"] == 0 and not own["cpu_clock"]
    hetero = mod.own_bound_summary(mod.bracketed_runs(sub, result["run_probes"][1], 10**9))
    assert hetero["phase_changed"] == 3 and hetero["pct_steady"] is None  # no run in one phase: no figure
    assert hetero["pct"] == pytest.approx(60.0)  # 30/50, 33.6/56, 28/37
    # the probe a little faster after than before, and a little slower: 12.5 % either way is one phase
    assert not any(r["phase_changed"] for r in mod.bracketed_runs([1.0, 1.0], [[40.0, 45.0], [45.0, 40.0]], 1))
    assert all(r["phase_changed"] for r in mod.bracketed_runs([1.0, 1.0], [[40.0, 47.0], [47.0, 40.0]], 1))

    summary = mod.pair_summary(result, 10**9, "tg4")["tests"]["tg4"]
    assert summary["read_gbs"] == [13.0, 30.0]  # median t/s x bytes a token
    # its run 2's probes read 61 GB/s by CPU time, 40 by the wall clock: lost CPU
    assert summary["own_bound"][0] == {**own, "lost_cpu": 1, "cpu_clock": True}
    assert [r["cpu_probes"] for r in summary["runs"][0]] == result["run_probes_cpu"][0]
    assert [{**r, "cpu_probes": None, "lost_cpu": None} for r in summary["runs"][0]] == runs
    # the rounds' probes (between rounds: 45, 47.5, 40 GB/s) stay as they were, beside the own-probe figures
    assert summary["pct_of_bound"][0] == pytest.approx(statistics.median([10 / 45, 20 / 47.5, 13 / 40]) * 100)
    assert "own_bound" not in mod.pair_summary({**result, "run_probes": None}, 10**9, "tg4")["tests"]["tg4"]


def test_markdown_with_own_probes_and_a_line_per_run():
    mod = bench_llm()
    result = _bracketed_result()
    row = {"model": "m", "type": "file", "threads": 2, "pair": result,
           "summary": mod.pair_summary(result, 10**9, "tg4")}
    lines = mod.paired_markdown([row]).splitlines()
    tg = [c.strip() for c in lines[2].strip("|").split("|")]
    assert tg[4] == "tg4" and tg[13:] == ["13.0 / 30.0", "40.0 / 50.0", "40 / 60", "33 / —",
                                          "1 / 3 of 3 (max 50 / 50 %); lost CPU 1 / 1"]
    start = lines.index("Each decode run between its own probes:")
    runs = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[start + 4:start + 10]]
    assert len(runs) == 6 and all(len(r) == 13 for r in runs)
    # in the order they ran: round 2 had hetero first
    assert [(r[3], r[4]) for r in runs] == [("1", "llama.cpp"), ("1", "hetero"), ("2", "hetero"),
                                            ("2", "llama.cpp"), ("3", "llama.cpp"), ("3", "hetero")]
    # llama.cpp's round 2: the probe before it read 40 GB/s by the wall clock, 61 by CPU time (it lost the CPU)
    assert runs[3][5:] == ["40.0", "20.0", "20.0", "60.0", "50", "40", "phase changed, lost CPU", "61.0 -> 61.0"]
    assert runs[4][5:] == ["30.0", "13.0", "13.0", "34.0", "13", "41", "", "31.0 -> 35.0"]
    assert lines[start + 10] == "" and lines[start + 11].startswith("probes by CPU clock:")
