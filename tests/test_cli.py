"""The hetero command: backends, run and demo, called as a user would (through main())."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest

from hetero.cli import main
from hetero.demo import tiny_cnn


def test_backends_table(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["backend", "version", "status", "devices"]
    assert any(r.startswith("reference") and " ok " in r for r in rows)


def test_backends_json(capsys):
    assert main(["backends", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    reference = next(r for r in rows if r["name"] == "reference")
    assert reference["status"] == "ok" and reference["devices"]


def test_run_with_input_file(tmp_path, capsys):
    model_path = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), model_path)
    image = np.random.default_rng(0).normal(size=(1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "image.npy", image)
    code = main(["run", str(model_path), "-b", "reference", "-i", f"image={tmp_path / 'image.npy'}", "-r", "2",
                 "--explain", "--save-outputs", str(tmp_path / "out")])
    assert code == 0
    out = capsys.readouterr().out
    assert "probs: float32[1, 10]" in out and "then median" in out and "stem.conv" in out
    probs = np.load(tmp_path / "out" / "probs.npy")
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-5)


def test_run_errors_are_one_line(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.onnx")]) == 2
    assert "does not exist" in capsys.readouterr().err
    model_path = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), model_path)
    assert main(["run", str(model_path), "-b", "reference"]) == 2
    assert "missing input(s) ['image']" in capsys.readouterr().err
    assert main(["run", str(model_path), "-b", "reference", "-i", "image"]) == 2
    assert "expected NAME=FILE.npy" in capsys.readouterr().err


def test_run_random_inputs(tmp_path, capsys):
    model_path = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), model_path)
    assert main(["run", str(model_path), "-b", "reference", "--random-inputs", "-r", "1"]) == 0
    assert "probs: float32[1, 10]" in capsys.readouterr().out


def test_demo_runs_and_matches_reference(capsys):
    assert main(["demo", "-b", "reference", "-r", "1", "--batch", "1"]) == 0
    assert "max |diff| vs reference 0.00e+00 OK" in capsys.readouterr().out


def test_console_script_entry_point():
    result = subprocess.run([sys.executable, "-m", "hetero", "backends"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "reference" in result.stdout


# -- as a user runs it: a subprocess (pipes) or a terminal -----------------------------------------------------------
from cli_terminal import Terminal, run_cli  # noqa: E402

from hetero import __version__  # noqa: E402


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hetero: error: ")]


def _atan_model(path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Atan", ["x"], ["y"], name="atan1")], "atan",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_version():
    result = run_cli(["--version"])
    assert result.returncode == 0 and result.stdout.strip() == f"hetero {__version__}"


def test_every_failure_is_one_error_line_and_status_2(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\x01 not protobuf" * 10)
    cases = [
        (["run", str(tmp_path)], str(tmp_path)),  # a folder: was `KeyError: ''`
        (["run", str(tmp_path / "missing.onnx")], "missing.onnx"),
        (["run", str(garbage), "--random-inputs"], "garbage.onnx"),
        (["info", str(garbage)], "garbage.onnx"),
        (["generate", "-m", str(tmp_path / "nope.gguf"), "-p", "hi"], "nope.gguf"),
        (["bench", "--synthetic", "tiny", "-t", "x"], "-t"),
    ]
    for args, named in cases:
        result = run_cli(args)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hetero: error: "), (args, result.stderr)
        assert named in lines[0], (args, lines[0])
        assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback(tmp_path):
    result = run_cli(["run", str(tmp_path)], HETERO_DEBUG="1")
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert _error_lines(result.stderr)


def test_a_bad_flag_shows_the_subcommands_usage():
    result = run_cli(["generate", "--no-such-flag"])
    assert result.returncode == 2
    usage, error = result.stderr.strip().splitlines()[0], result.stderr.strip().splitlines()[-1]
    assert usage.startswith("usage: hetero generate ")
    assert error.startswith("hetero: error: generate: unrecognized arguments: --no-such-flag")
    result = run_cli(["bench", "-o", "xml"])
    assert result.returncode == 2 and "usage: hetero bench" in result.stderr and "-o/--output" in result.stderr


def test_no_command_prints_help():
    result = run_cli([])
    assert result.returncode == 2 and "COMMAND" in result.stderr and "generate" in result.stderr


def test_every_flag_has_help_text():
    from hetero.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            assert action.help, f"hetero {name} {action.option_strings or action.dest} has no help"


def test_warnings_are_one_line_once(tmp_path, require_cpu):
    from hetero import plugins

    row = plugins.status("opencl")
    if row is None or not row.ok:
        pytest.skip("a fallback from opencl needs a working opencl backend")
    model = _atan_model(tmp_path / "atan.onnx")  # Atan has no opencl kernel: it falls back to cpu
    result = run_cli(["run", str(model), "-b", "opencl", "--random-inputs", "-r", "2"])
    assert result.returncode == 0, result.stderr
    warnings_ = [line for line in result.stderr.splitlines() if "warning" in line.lower()]
    assert warnings_ == ["hetero: warning: 1/1 nodes on cpu: Atan×1"]
    assert ".py:" not in result.stderr


def test_a_backend_skipped_automatically_is_not_mentioned(tmp_path, require_cpu):
    model = _atan_model(tmp_path / "atan.onnx")
    no_opencl = {"OCL_ICD_VENDORS": str(tmp_path / "no-icd")}  # the OpenCL loader finds no driver
    result = run_cli(["run", str(model), "--random-inputs", "-r", "1"], **no_opencl)
    assert result.returncode == 0, result.stderr
    assert "opencl" not in result.stderr and "warning" not in result.stderr
    verbose = run_cli(["run", str(model), "--random-inputs", "-r", "1", "-v"], **no_opencl)
    assert "hetero: warning: backend opencl skipped" in verbose.stderr or "opencl" not in run_cli(
        ["backends"], **no_opencl).stdout  # (where opencl is not installed at all, there is nothing to skip)


def test_hints_speak_the_command_line():
    from hetero.cli_errors import error_message
    from hetero.contract import HeteroError

    exc = HeteroError("the prompt has 90 tokens; the context holds 64", hint="load the model with a larger "
                      "context=...")
    assert error_message(exc) == "the prompt has 90 tokens; the context holds 64 (hint: load the model with a " \
        "larger context (-c N))"
    assert error_message(HeteroError("context=0; expected a positive number of tokens")) == \
        "-c 0; expected a positive number of tokens"
    assert error_message(HeteroError("requested backends cannot start:\n  a: x\n  b: y")) == \
        "requested backends cannot start: a: x; b: y"


def test_run_on_a_model_with_a_prompt_is_an_error(tmp_path):
    model = _atan_model(tmp_path / "atan.onnx")
    result = run_cli(["run", str(model), "hello"])
    assert result.returncode == 2 and "needs an LLM" in _error_lines(result.stderr)[0]


def test_info_on_an_onnx_model_keeps_symbolic_dims(tmp_path):
    model_path = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), model_path)
    result = run_cli(["info", str(model_path)])
    assert result.returncode == 0, result.stderr
    assert "image: float[N, 3, 32, 32]" in result.stdout and "probs: float[N, 10]" in result.stdout
    assert "ai.onnx 17" in result.stdout and "Conv×4" in result.stdout
    facts = json.loads(run_cli(["info", str(model_path), "--json"]).stdout)
    assert facts["inputs"] == [{"name": "image", "type": "float", "shape": ["N", 3, 32, 32]}]
    assert facts["ops"]["Conv"] == 4 and facts["nodes"] == 17 and facts["params"] > 0


def test_progress_draws_on_a_terminal_only(tmp_path):
    model_path = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), model_path)
    args = ["run", str(model_path), "-b", "reference", "--random-inputs", "-r", "1"]
    term = Terminal(args)
    try:
        term.expect(r"loading cnn\.onnx \.\.\.")
        term.expect(r"then median")
        assert term.wait() == 0
    finally:
        term.close()
    quiet = Terminal([*args, "--quiet"])
    try:
        quiet.expect(r"then median")
        assert quiet.wait() == 0
        assert "loading" not in quiet.output and "\r" not in quiet.output.replace("\r\n", "")
    finally:
        quiet.close()
    piped = run_cli(args)
    assert piped.returncode == 0 and piped.stderr == ""
    verbose = run_cli([*args, "-v"])
    assert re.search(r"^loading cnn\.onnx: \d+\.\d+ s$", verbose.stderr, re.M), verbose.stderr


def test_unexpected_exceptions_become_one_line_naming_what_was_given():
    from hetero.cli_errors import error_message

    assert error_message(KeyError(""), "models/") == "models/: KeyError: '' (an internal error: HETERO_DEBUG=1 " \
        "shows where; please report it)"
    assert error_message(AssertionError(), "vad.onnx").startswith("vad.onnx: AssertionError: (no message)")
    missing = FileNotFoundError(2, "No such file or directory", "x.npy")
    assert error_message(missing) == "x.npy: No such file or directory"
