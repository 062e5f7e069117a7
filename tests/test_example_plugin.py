"""The tutorial's backend package, examples/hetero-toy, installed with pip and put through discovery, a Session and
the conformance kit; and the tutorial shows exactly the files of that package."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import hetero
from conftest import load_script
from hetero import plugins
from hetero.testing import conformance
from hetero.testing.dist import Site, plugin_site

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "hetero-toy"
DOC = REPO / "docs" / "backend-authors.md"


@pytest.fixture(scope="module")
def toy_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose site/ holds hetero-toy as pip installs it (built from a copy: pip writes into the source)."""
    home = tmp_path_factory.mktemp("toy")
    source = home / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "--target", str(home / "site"), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return home


@pytest.fixture
def site(toy_home: Path) -> Iterator[Site]:
    with plugin_site(toy_home) as s:
        yield s


def load_demo() -> object:
    return load_script(EXAMPLE / "demo.py", "hetero_toy_demo")


def test_discovery_finds_the_installed_package(site: Site) -> None:
    site.reload()
    row = plugins.status("toy")
    assert row is not None and row.ok, row
    assert (row.distribution, row.version, row.priority) == ("hetero-toy", "0.1.0", 40)
    assert [d.name for d in row.devices] == ["toy0"]


def test_no_device_is_a_status_line(site: Site) -> None:
    site.setenv("HETERO_TOY_DEVICES", "0")
    site.reload()
    row = plugins.status("toy")
    assert row.status == plugins.UNAVAILABLE
    assert row.reason == "no toy device: HETERO_TOY_DEVICES=0" and "unset HETERO_TOY_DEVICES" in row.hint


def test_the_entry_point_module_imports_no_kernels(site: Site) -> None:
    code = "import sys, hetero_toy; assert 'hetero_toy.backend' not in sys.modules; print('light')"
    proc = subprocess.run([sys.executable, "-c", code], env=site.subprocess_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "light" in proc.stdout, proc.stderr


def test_session_places_add_and_relu_on_toy_and_falls_back_for_sigmoid(site: Site) -> None:
    site.reload()
    session = hetero.Session(load_demo().build_model(), backends=["toy"], on_fallback="silent")
    placed = {p.name: p for p in session.placement.nodes}
    assert placed["add"].backend == placed["relu"].backend == "toy"
    assert placed["sigmoid"].fallback and placed["sigmoid"].refusals == {"toy": "no toy kernel for Sigmoid"}
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    bias = np.array([0.5, -0.5, 1.0, -1.0], np.float32)
    np.testing.assert_allclose(session.run({"x": x})["y"], 1 / (1 + np.exp(-np.maximum(x + bias, 0))), rtol=1e-6)
    explained = session.explain()
    assert "toy: no toy kernel for Sigmoid" in explained and "(fallback)" in explained


def test_demo_script_runs(site: Site) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLE / "demo.py")], env=site.subprocess_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "toy        ok       hetero-toy 0.1.0  toy0" in proc.stdout
    assert "add      Add      toy" in proc.stdout and "toy: no toy kernel for Sigmoid" in proc.stdout


def test_toy_passes_the_conformance_kit(site: Site) -> None:
    site.reload()
    report = conformance.check_backend("toy")
    assert report.ok, str(report)
    status = {r.check: r for r in report.results}
    assert status["op Relu[2x3x4x5]"].status == status["op Add[2x1x4,3x1]"].status == conformance.PASS
    int_add = status["op Add[2x3x4,4 int64]"]
    assert int_add.status == conformance.SKIP and "toy Add runs float32 only" in int_add.reason
    # The tutorial's transcript of `python -m hetero.testing --backend toy` is this report, line for line.
    transcript = DOC.read_text(encoding="utf-8").split("$ python -m hetero.testing --backend toy\n", 1)[1]
    shown = [line for line in transcript.split("```", 1)[0].splitlines() if line and line != "..."]
    assert len(shown) >= 10
    assert [line for line in shown if line not in {str(r) for r in report.results}] == []


def test_the_example_packages_own_tests_pass(site: Site, tmp_path: Path) -> None:
    shutil.copytree(EXAMPLE / "tests", tmp_path / "tests")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "tests")],
        env=site.subprocess_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


EXAMPLE_FILES = sorted(
    p.relative_to(EXAMPLE).as_posix()
    for p in EXAMPLE.rglob("*")
    if p.is_file() and p.suffix in (".py", ".toml") and "__pycache__" not in p.parts and "build" not in p.parts
)


@pytest.mark.parametrize("relative", EXAMPLE_FILES)
def test_the_tutorial_shows_each_example_file_verbatim(relative: str) -> None:
    doc = DOC.read_text(encoding="utf-8")
    content = (EXAMPLE / relative).read_text(encoding="utf-8")
    assert f"examples/hetero-toy/{relative}" in doc, f"the tutorial never names {relative}"
    assert content.strip() in doc, f"the tutorial's copy of {relative} differs from the file"
