"""The hetero command: backends, run and demo, called as a user would (through main())."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx

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
    assert "probs: float32[1, 10]" in out and "run median" in out and "stem.conv" in out
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
