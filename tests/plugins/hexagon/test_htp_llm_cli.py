"""``hetero generate`` and ``hetero bench`` with ``--backend hexagon``: the LLM's steps run on the HTP decoder graphs
(``Backend.llm_decoder``), the speeds carry the note that the simulator's are not the device's; a model the graphs
do not cover runs through a session on cpu, with a warning saying why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetero.cli import build_parser
from hetero.contract import BackendUnavailable, HeteroWarning
from hetero.llm.generate import greedy_tokens
from hetero.llm.loader import load

pytest.importorskip("hetero_hexagon.llm_decoder")
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llm"


def run_cli(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


def test_bench_runs_the_htp_decoder(hexagon, capsys):
    assert run_cli(["bench", "-m", str(FIXTURES / "qwen3"), "-b", "hexagon", "-q", "q4", "-p", "8", "-n", "2",
                    "-r", "1", "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert [r["test"] for r in rows] == ["pp8", "tg2"]
    assert all(r["backend"] == "hexagon (HTP simulator, q4)" and r["avg_ts"] > 0 for r in rows)
    assert "QNN's HTP simulator" in captured.err and "not the speed of a Snapdragon's NPU" in captured.err


def test_generate_on_the_htp_gives_cpus_greedy_text(hexagon, capsys):
    folder = FIXTURES / "qwen3"
    prompt = json.loads((folder / "expected.json").read_text())["prompts"][1]
    assert run_cli(["generate", str(folder), prompt["text"], "-n", "6", "--temp", "0", "-c", "64", "-b",
                    "hexagon", "-q", "q4"]) == 0
    captured = capsys.readouterr()
    cpu = load(folder, backends=["cpu"], quant="q4", context=64)
    want = cpu.detokenize(greedy_tokens(cpu, cpu.tokenize(prompt["text"]), 6), skip_special_tokens=True)
    assert captured.out == want + "\n"
    assert "generated 6 tokens" in captured.err and "QNN's HTP simulator" in captured.err


def test_a_model_the_graphs_do_not_cover_runs_on_cpu(hexagon):
    with pytest.warns(HeteroWarning, match="hexagon does not run .* whole .*rope_type 'yarn'"):
        llm = load(FIXTURES / "qwen2", backends=["hexagon", "cpu"], on_fallback="silent", context=32)
    assert llm.decoder is None and llm.backend_names() == ["cpu"]


def test_generate_with_the_hvx_decode_step(hexagon, capsys, monkeypatch):
    from hetero_hexagon.hvx_qemu import find_toolchain

    try:
        find_toolchain()
    except BackendUnavailable as e:
        pytest.skip(e.message)
    monkeypatch.setenv("HETERO_HEXAGON_LLM", "hvx")
    folder = FIXTURES / "qwen3"
    assert run_cli(["generate", str(folder), "Hi", "-n", "3", "--temp", "0", "-c", "16", "-b", "hexagon", "-q",
                    "q4"]) == 0
    captured = capsys.readouterr()
    cpu = load(folder, backends=["cpu"], quant="q4", context=16)
    want = cpu.detokenize(greedy_tokens(cpu, cpu.tokenize("Hi"), 3), skip_special_tokens=True)
    assert captured.out == want + "\n"
    assert "qemu-hexagon" in captured.err


def test_speculative_greedy_output_is_plain_decoding_on_the_htp(hexagon, monkeypatch):
    """Speculative decoding through the whole-decoder contract: each verify block is one ``run(ids, past)`` of the
    HTP's chunk graph, a rejected tail forgotten by the next call's ``past``; the greedy tokens are plain decoding's
    with drafts accepted in full, in part and not at all."""
    from llm.test_speculative import PROMPT, Scripted, _plain

    from hetero.llm.speculative import Lookahead, Speculation

    llm = load(FIXTURES / "qwen3", backends=["hexagon"], context=64)
    assert llm.decoder is not None and llm.decoder.name.startswith("hexagon (HTP")
    want = _plain(llm, PROMPT, 24)
    blocks: list[int] = []
    run = llm.decoder.run
    monkeypatch.setattr(llm.decoder, "run", lambda ids, past: (blocks.append(len(ids)), run(ids, past))[1])
    for drafter in (Scripted(want, len(PROMPT), max_draft=4), Lookahead(min_ngram=1)):
        llm.reset()
        blocks.clear()
        llm.generate(PROMPT, 24, temperature=0, spec=Speculation(drafter, adaptive=False))
        assert list(llm.last.tokens) == want
        assert llm.stats.verify_steps > 0 and llm.stats.accepted_tokens < llm.stats.drafted_tokens
        assert sum(n > 1 for n in blocks[1:]) == llm.stats.verify_steps  # one decoder call per verify block
