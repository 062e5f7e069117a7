"""``hetero bench`` / ``generate`` / ``chat`` through their CLI functions, and the synthetic models."""

from __future__ import annotations

import argparse
import io
import json

import numpy as np
import pytest

from hetero.cli import build_parser
from hetero.contract import HeteroError
from hetero.llm import bench as bench_mod
from hetero.llm.synthetic import SyntheticWeights, load_synthetic, synthetic_config

from .helpers import FIXTURES, expected


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_bench_markdown_table(capsys):
    args = parse(["bench", "--synthetic", "tiny", "-p", "8", "-n", "4", "-pg", "8,4", "-r", "2", "-t", "1"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == [
        "model", "size", "params", "backend", "threads", "test", "t/s"]
    tests = [line.split("|")[6].strip() for line in lines[2:]]
    assert tests == ["pp8", "tg4", "pp8+tg4"]
    assert all("±" in line for line in lines[2:])
    cols = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cols[0] == "qwen3 tiny synthetic q4_sym_b32" and cols[4] == "1"


def test_bench_json_on_a_model_folder(capsys):
    args = parse(["bench", "-m", str(FIXTURES / "qwen2"), "-p", "4,8", "-n", "0", "-r", "3", "--json",
                  "--no-warmup"])
    assert args.func(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["pp4", "pp8"]
    for r in rows:
        assert len(r["samples_ts"]) == 3 and r["avg_ts"] > 0 and r["stdev_ts"] >= 0
        assert r["params"] > 0 and r["size_bytes"] > 0 and r["n_gen"] == 0


def test_bench_profile_splits_a_decode_step(capsys):
    args = parse(["bench", "--synthetic", "tiny", "-p", "8", "-n", "4", "-r", "1", "--json", "--profile"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    profile = out["profile"]
    assert [r["test"] for r in out["results"]] == ["pp8", "tg4"]
    assert profile["step_us"] > 0 and 0 <= profile["outside_pct"] <= 100
    ops = {op["op"]: op for op in profile["ops"]}
    assert {"QMatMul", "Attention", "RMSNorm"} <= set(ops)  # every kernel of the decoder was timed
    assert all(op["calls"] > 0 for op in ops.values())


def test_bench_arguments_are_checked():
    for argv in (["bench", "--synthetic", "tiny", "-pg", "8"], ["bench", "--synthetic", "tiny", "-p", "x"],
                 ["bench", "--synthetic", "tiny", "-p", "0", "-n", "0"],
                 ["bench", "--synthetic", "tiny", "-p", "64", "-c", "16"]):
        args = parse(argv)
        with pytest.raises(HeteroError):
            args.func(args)


def test_bench_semantics_counts_tokens():
    llm = load_synthetic("tiny", context=64, on_fallback="silent", progress=False)
    calls = []
    original = llm.forward

    def counting(ids):
        calls.append(len(ids))
        return original(ids)

    llm.forward = counting
    (result,) = bench_mod.bench(llm, [(16, 4)], repetitions=1, warmup=False)
    assert calls == [16, 1, 1, 1, 1]  # prefill then decode on the same cache
    assert result.test == "pp16+tg4" and len(result.samples_ts) == 1
    calls.clear()
    bench_mod.bench(llm, [(0, 3)], repetitions=1, warmup=False)
    assert calls == [1, 1, 1, 1]  # one untimed context token, then 3 decode steps


def test_generate_command(capsys):
    prompt = expected("qwen3")["prompts"][0]
    args = parse(["generate", str(FIXTURES / "qwen3"), prompt["text"], "-n", "6", "--temp", "0"])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    from .helpers import load

    want = load(FIXTURES / "qwen3").detokenize(prompt["greedy"][:6], skip_special_tokens=True)
    assert captured.out == want + "\n"
    assert "generated 6 tokens" in captured.err


def test_chat_command_reads_turns(capsys):
    from hetero.llm import cli

    args = parse(["chat", str(FIXTURES / "qwen3"), "-n", "4", "--temp", "0", "--system", "Be brief."])
    stdin = io.StringIO("Hello!\n/reset\nWhat is the capital of France?\nAnd of Germany?\n/exit\nignored\n")
    assert cli._cmd_chat(args, stdin=stdin) == 0
    err = capsys.readouterr().err
    stats = [line for line in err.splitlines() if "generated" in line]
    assert len(stats) == 3 and "(conversation cleared)" in err
    assert "(0 cached)" in stats[1]  # after /reset nothing is reused
    assert "(0 cached)" not in stats[2]  # the last turn reuses the previous one


def test_chat_with_spec_warms_the_verify_widths_at_load(capsys, monkeypatch):
    """``hetero chat --spec``: every verify width is planned and recorded at load (``Speculation.warm``), not in the
    first replies; the replies are those of plain greedy decoding."""
    from hetero.llm import cli
    from hetero.llm.speculative import Speculation

    turns = "Hello!\nWhat is the capital of France?\n/exit\n"
    outs = []
    warmed: list[list[int]] = []
    warm = Speculation.warm
    monkeypatch.setattr(Speculation, "warm", lambda self, llm: warmed.append(warm(self, llm)) or warmed[-1])
    for extra in ([], ["--spec", "lookahead"]):
        args = parse(["chat", str(FIXTURES / "qwen3"), "-n", "8", "--temp", "0", *extra])
        assert cli._cmd_chat(args, stdin=io.StringIO(turns)) == 0
        outs.append(capsys.readouterr().out)
        assert warmed == ([list(range(1, 9))] if extra else [])  # the lookahead drafts up to 8 tokens
    assert outs[0] == outs[1]


def test_synthetic_weights_are_deterministic_and_valid():
    cfg = synthetic_config("tiny")
    from hetero.contract.quant import QuantFormat, dequantize

    for fmt in (QuantFormat(4, 32, True), QuantFormat(8, 64, False), QuantFormat(8, 32, True)):
        a = SyntheticWeights(fmt, seed=1).linear("w", 8, cfg.hidden_size).array
        b = SyntheticWeights(fmt, seed=1).linear("w", 8, cfg.hidden_size).array
        np.testing.assert_array_equal(a, b)
        dense = dequantize(a, fmt, cfg.hidden_size)
        assert np.isfinite(dense).all() and 0.3 < dense.std() * np.sqrt(cfg.hidden_size) < 3
    qwen = synthetic_config("qwen3-0.6b")
    assert (qwen.num_layers, qwen.hidden_size, qwen.vocab_size, qwen.num_kv_heads) == (28, 1024, 151936, 8)


def test_synthetic_model_runs_and_counts_params():
    llm = load_synthetic("tiny", context=32, on_fallback="silent", progress=False)
    cfg = llm.config
    per_layer = (cfg.hidden_size * cfg.head_dim * (cfg.num_heads * 2 + cfg.num_kv_heads * 2)
                 + 3 * cfg.hidden_size * cfg.intermediate_size + 2 * cfg.hidden_size + 2 * cfg.head_dim)
    assert llm.num_params() == cfg.vocab_size * cfg.hidden_size + cfg.num_layers * per_layer + cfg.hidden_size
    logits = llm.prefill([1, 2, 3])
    assert logits.shape == (1, cfg.vocab_size) and np.isfinite(logits).all()


def test_bench_sweeps_threads_and_backends_in_one_table(capsys):
    args = parse(["bench", "--synthetic", "tiny", "-p", "8", "-n", "2", "-r", "1", "--no-warmup", "-t", "1,2",
                  "-o", "json"])
    assert args.func(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["threads"], r["test"]) for r in rows] == [(1, "pp8"), (1, "tg2"), (2, "pp8"), (2, "tg2")]
    args = parse(["bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--no-warmup", "-a",
                  "cpu,reference"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("|")[4].strip() for line in lines[2:]] == ["cpu", "reference"]  # MNN llm_bench's -a


def test_bench_output_formats(capsys):
    base = ["bench", "--synthetic", "tiny", "-p", "8", "-n", "2", "-r", "2", "--no-warmup", "-t", "1"]
    args = parse([*base, "-o", "csv"])
    assert args.func(args) == 0
    import csv

    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["test"] for r in rows] == ["pp8", "tg2"]
    assert all(float(r["avg_ts"]) > 0 and len(r["samples_ts"].split(";")) == 2 for r in rows)
    args = parse([*base, "-o", "jsonl"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [json.loads(line)["test"] for line in lines] == ["pp8", "tg2"]


def test_bench_rejects_b_with_a():
    args = parse(["bench", "--synthetic", "tiny", "-b", "cpu", "-a", "cpu,reference"])
    with pytest.raises(HeteroError, match="not both"):
        args.func(args)


def test_info_on_a_gguf_file_and_a_model_folder(capsys):
    from hetero.cli import main

    assert main(["info", str(FIXTURES.parent / "gguf" / "qwen3k-q4_k_m.gguf"), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["architecture"] == "qwen3" and facts["file_type"] == "Q4_K_M" and facts["context_length"] == 2048
    assert {"Q4_K", "Q6_K"} <= set(facts["quantization_mix"])
    assert facts["tokenizer"]["model"] == "gpt2" and facts["tokenizer"]["vocab"] == 320
    assert facts["chat_template"]["style"] == "chatml" and facts["chat_template"]["thinking"]
    assert main(["info", str(FIXTURES.parent / "gguf" / "qwen3k-q4_k_m.gguf")]) == 0
    text = capsys.readouterr().out
    assert "context   2048 tokens" in text and "mix: Q" in text and "template  chatml" in text
    assert main(["info", str(FIXTURES / "qwen3")]) == 0
    text = capsys.readouterr().out
    assert "model_type qwen3" in text and "safetensors" in text and "tokenizer tokenizer.json" in text
