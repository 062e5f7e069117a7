"""benchmarks/decode_after.py (issue 20): tg runs after a tg run, a prefill, a sleep, another process's memory
stream, in rotated order within one process. The summary logic runs on made-up step times; one real short run on a
tiny GGUF made from the test fixtures checks that every condition runs and the JSON holds what the summary needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def decode_after():
    return load_script(ROOT / "benchmarks" / "decode_after.py", "decode_after_under_test")


def test_rotation_runs_each_condition_once_and_moves_the_first():
    mod = decode_after()
    conds = ["warm", "pp", "sleep", "stream"]
    orders = [mod.rotated(conds, r) for r in range(5)]
    assert all(sorted(o) == sorted(conds) for o in orders)
    assert [o[0] for o in orders] == ["warm", "pp", "sleep", "stream", "warm"]


def _run(steps: list[float], cpu: list[float] | None = None) -> dict:
    return {"steps": steps, "cpu_steps": cpu or steps, "minflt": 3, "majflt": 0, "before_minflt": 7}


def test_summary_separates_a_one_time_cost_from_a_lasting_one():
    mod = decode_after()
    warm = [0.01] * 16
    first_only = [0.05] * 8 + [0.01] * 8    # the first 8 steps slow: a one-time cost
    lasting = [0.02] * 16                   # every step slow
    runs = {"warm": [_run(warm), _run([0.02] * 16)],  # the 2nd round's warm is itself 2x slower (a busy moment)
            "pp": [_run(first_only), _run([0.1] * 8 + [0.02] * 8)],
            "sleep": [_run(lasting), _run([0.04] * 16)]}
    s = mod.summarize(runs, head=8)
    assert s["warm"]["ratio"] == pytest.approx(1.0)
    # ratios are taken within a round, so the busy 2nd round does not move them
    assert s["pp"]["ratio_head"] == pytest.approx(5.0) and s["pp"]["ratio_rest"] == pytest.approx(1.0)
    assert s["pp"]["ratio"] == pytest.approx(3.0)
    assert s["sleep"]["ratio_head"] == pytest.approx(2.0) and s["sleep"]["ratio_rest"] == pytest.approx(2.0)
    assert s["pp"]["ts"] == pytest.approx((16 / 0.48 + 16 / 0.96) / 2)  # the median of the two rounds' t/s
    assert s["pp"]["first_ms"] == pytest.approx(75.0) and s["pp"]["before_minflt"] == 7


def test_summary_cpu_clock_reads_the_cpu_step_times():
    mod = decode_after()
    runs = {"warm": [_run([0.01] * 10, [0.005] * 10)], "pp": [_run([0.03] * 10, [0.005] * 10)]}
    assert mod.summarize(runs, "wall")["pp"]["ratio"] == pytest.approx(3.0)
    assert mod.summarize(runs, "cpu")["pp"]["ratio"] == pytest.approx(1.0)


def test_conditions_must_include_warm():
    with pytest.raises(SystemExit):
        decode_after().main(["x.gguf", "--conditions", "pp,sleep"])


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    pytest.importorskip("gguf", reason="the gguf package (the GGUF writer of the test fixtures) is absent")
    writer = load_script(ROOT / "scripts" / "make_gguf_fixtures.py", "make_gguf_fixtures", shared=True)
    path = tmp_path_factory.mktemp("decode_after") / "qwen2-f16.gguf"
    writer.convert(ROOT / "tests" / "fixtures" / "llm" / "qwen2", path, "F16")
    return path


def test_real_run_on_a_tiny_model(tiny_gguf, capsys):
    mod = decode_after()
    assert mod.main([str(tiny_gguf), "--rounds", "2", "--tg", "10", "--pp", "8", "--idle", "0.05",
                     "--stream-mib", "8", "--clock", "cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["runs"]) == set(mod.CONDITIONS) and doc["clock"] == "cpu"
    for rs in doc["runs"].values():
        assert len(rs) == 2 and all(len(r["steps"]) == 10 == len(r["cpu_steps"]) for r in rs)
        assert all(t > 0 for r in rs for t in r["steps"])
    assert min(r["setup_s"] for r in doc["runs"]["sleep"]) >= 0.05
    assert doc["summary"]["warm"]["ratio"] == pytest.approx(1.0)


def test_probe_after_each_run_is_recorded(tiny_gguf, capsys, monkeypatch):
    mod = decode_after()
    calls = []
    readings = iter([10.0, 20.0, 21.0, 40.0, 12.0])
    monkeypatch.setattr(mod, "probe", lambda threads: calls.append(threads) or {"best": next(readings)})
    assert mod.main([str(tiny_gguf), "--rounds", "2", "--tg", "4", "--pp", "8", "--conditions", "warm,pp",
                     "--probe", "--threads", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert calls == [1] * 5  # one before the first run, one after each
    # the order: warm, pp | pp, warm; each run's "before" is the probe that came before it
    assert [[r["probe_before_gbps"], r["probe_gbps"]] for r in doc["runs"]["warm"]] == [[10.0, 20.0], [40.0, 12.0]]
    assert [[r["probe_before_gbps"], r["probe_gbps"]] for r in doc["runs"]["pp"]] == [[20.0, 21.0], [21.0, 40.0]]
    assert doc["bytes_per_token"] > 0
    own = doc["own_bound"]
    assert own["warm"]["phase_changed"] == 2 and own["warm"]["pct_steady_min"] is None
    assert own["pp"]["phase_changed"] == 1 and own["pp"]["n"] == 2
    assert own["pp"]["lost_cpu"] == 0 and "probe_cpu_gbps" not in run_keys(doc)  # the fake kept no CPU clock
    run = doc["runs"]["pp"][0]
    ts = len(run["steps"]) / sum(run["steps"])
    assert own["pp"]["pct_steady_min"] == pytest.approx(100 * ts * doc["bytes_per_token"] / 20.5e9)


def test_own_bound_per_condition():
    mod = decode_after()
    # 1 GB a step; steps of 0.1 s: 10 t/s, 10 GB/s read
    runs = {"warm": [dict(_run([0.1] * 4), probe_before_gbps=20.0, probe_gbps=20.0),
                     dict(_run([0.1] * 4), probe_before_gbps=10.0, probe_gbps=11.0),
                     dict(_run([0.1] * 4), probe_before_gbps=10.0, probe_gbps=40.0)]}
    o = mod.own_bound(runs, 10**9)["warm"]
    assert [r["pct"] for r in o["runs"]] == pytest.approx([50.0, 100 / 1.05, 40.0])
    assert o["phase_changed"] == 1 and o["pct_steady_min"] == pytest.approx(50.0)  # the 40 % run is flagged
    assert o["read_gbs"] == pytest.approx(10.0) and o["lost_cpu"] == 0
    # by CPU time the 20 GB/s run's probes read 30: they lost the CPU, so that run is left out of "agree" too
    cpu = [(30.0, 30.0), (10.5, 11.0), (10.0, 40.0)]
    for r, (before, after) in zip(runs["warm"], cpu, strict=True):
        r.update(probe_before_cpu_gbps=before, probe_cpu_gbps=after)
    o = mod.own_bound(runs, 10**9)["warm"]
    assert [r["lost_cpu"] for r in o["runs"]] == [True, False, False] and o["lost_cpu"] == 1
    assert o["pct_steady_min"] == pytest.approx(100 / 1.05) and o["pct_steady"] == pytest.approx(100 / 1.05)


def run_keys(doc: dict) -> set:
    return {k for rs in doc["runs"].values() for r in rs for k in r}


def test_a_run_no_longer_than_the_head_has_no_rest():
    mod = decode_after()
    s = mod.summarize({"warm": [_run([0.01] * 4)], "pp": [_run([0.02] * 4)]}, head=8)
    assert s["pp"]["ratio"] == pytest.approx(2.0) and s["pp"]["ratio_head"] == pytest.approx(2.0)
    assert s["pp"]["ratio_rest"] != s["pp"]["ratio_rest"]  # nan
