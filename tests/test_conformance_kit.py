"""The conformance kit: the reference passes it, and deliberately broken throwaway backends are caught by it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hetero.contract import registry
from hetero.testing import cases, conformance
from hetero.testing.dist import Site, plugin_site


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    with plugin_site(tmp_path) as s:
        yield s


def test_reference_passes_every_check() -> None:
    report = conformance.check_backend("reference")
    assert report.ok, str(report)
    with_schema = [c for c in cases.CASES if registry.find(c.domain, c.op) is not None]
    assert report.count(conformance.PASS) == 7 + len(with_schema)
    skipped = [r for r in report.results if r.status == conformance.SKIP]
    assert all("no schema" in r.reason for r in skipped), skipped  # the reference claims every op hetero knows


# A correct host-memory table backend with Relu and Add; each variant below breaks one thing after it.
GOOD = """
    from typing import ClassVar

    import numpy as np

    from hetero.contract import SUPPORTED, Device, Factory, HostMemory, KernelTableBackend, Support
    from hetero.contract import hookimpl

    api_version = "1.0"


    class Relu:
        def __init__(self, node):
            pass

        def prepare(self, inputs, outputs):
            pass

        def run(self, inputs, outputs):
            np.maximum(inputs[0].numpy(), 0, out=outputs[0].numpy())


    class Add(Relu):
        def run(self, inputs, outputs):
            np.add(inputs[0].numpy(), inputs[1].numpy(), out=outputs[0].numpy())


    class TBackend(HostMemory, KernelTableBackend):
        name: ClassVar[str] = "tkit"
        kernels: ClassVar = {("", "Relu"): Relu, ("", "Add"): Add}


    class TFactory(Factory):
        name: ClassVar[str] = "tkit"

        def probe(self):
            return [Device("tkit0")]

        def create(self, device, options=None):
            return TBackend(device, options)


    @hookimpl
    def hetero_register_backends(register):
        register(TFactory())
"""

# variant -> (code appended to GOOD, the checks that must FAIL: name fragment -> reason fragment)
BROKEN: dict[str, tuple[str, dict[str, str]]] = {
    "wrong relu": (
        """
        class AbsRelu(Relu):  # the bug: |x| instead of max(x, 0)
            def run(self, inputs, outputs):
                np.abs(inputs[0].numpy(), out=outputs[0].numpy())

        TBackend.kernels = {**TBackend.kernels, ("", "Relu"): AbsRelu}
        """,
        {"op Relu[7]": "values differ", "op Relu[2x3x4x5]": "values differ", "kernels prepare/run": "Relu"},
    ),
    "kernel ignores its output": (
        """
        class FreshAdd(Add):  # the bug: computes into a new array, the preallocated output stays as it was
            def run(self, inputs, outputs):
                np.add(inputs[0].numpy(), inputs[1].numpy())

        TBackend.kernels = {**TBackend.kernels, ("", "Add"): FreshAdd}
        """,
        {"kernels prepare/run": "preallocated outputs"},
    ),
    "refusal without a reason": (
        """
        def supports(self, node):
            found = (node.domain, node.op_type) in self.kernels
            return SUPPORTED if found else Support(False)

        TBackend.supports = supports
        """,
        {"supports()": "without a reason"},
    ),
    "lossy download": (
        """
        TBackend.download = lambda self, tensor: tensor.buffer.astype(np.float32)
        """,
        {"memory round trip": "differs"},
    ),
    "close twice fails": (
        """
        def close(self):
            if getattr(self, "closed", False):
                raise RuntimeError("tkit closed twice")
            self.closed = True

        TBackend.close = close
        """,
        {"close()": "closed twice"},
    ),
    "names differ": (
        """
        TBackend.name = "tkit-backend"
        """,
        {"create()": "tkit-backend"},
    ),
}


@pytest.mark.parametrize("variant", list(BROKEN))
def test_kit_catches_a_broken_backend(site: Site, variant: str) -> None:
    extra, expected = BROKEN[variant]
    site.add("hetero-tkit", {"tkit.py": textwrap.dedent(GOOD) + textwrap.dedent(extra)}, {"tkit": "tkit"})
    site.reload()
    report = conformance.check_backend("tkit", ops=["Relu", "Add", "Sigmoid"])
    failed = {r.check: r.reason for r in report.failures}
    for fragment, reason in expected.items():
        hits = [check for check in failed if fragment in check]
        assert hits, f"{fragment!r} did not fail; failures: {failed}"
        assert all(reason in failed[h] for h in hits), failed
    assert not report.ok
    with pytest.raises(AssertionError, match=r"fails \d+ conformance check"):
        conformance.run("tkit", ops=["Relu", "Add"], verbose=False)


def test_a_correct_table_backend_passes_and_skips_what_it_does_not_claim(site: Site) -> None:
    site.add("hetero-tkit", {"tkit.py": GOOD}, {"tkit": "tkit"})
    site.reload()
    report = conformance.run("tkit", ops=["Relu", "Add", "Sigmoid"], verbose=False)
    by_check = {r.check: r for r in report.results}
    assert by_check["op Relu[7]"].status == conformance.PASS
    assert by_check["op Add[2x1x4,3x1]"].status == conformance.PASS  # broadcasting both ways
    assert by_check["op Add[2x3x4,4 int64]"].status == conformance.PASS
    sigmoid = by_check["op Sigmoid[7]"]
    assert sigmoid.status == conformance.SKIP and "no tkit kernel for Sigmoid" in sigmoid.reason


def test_an_uninstalled_backend_fails_the_status_check() -> None:
    report = conformance.check_backend("no-such-backend", ops=["Relu"])
    first = report.results[0]
    assert first.status == conformance.FAIL and "not installed" in first.reason
    assert all(r.status == conformance.SKIP for r in report.results[1:])


def test_compare_reports_what_differs() -> None:
    a = np.array([1.0, 2.0, 3.0], np.float32)
    assert conformance.compare(a, a.copy()) == ""
    assert conformance.compare(a * (1 + 1e-6), a) == ""  # within float32 tolerance
    assert "dtype float64" in conformance.compare(a.astype(np.float64), a)
    assert "shape [1, 3]" in conformance.compare(a.reshape(1, 3), a)
    message = conformance.compare(np.array([1.0, 2.5, 3.0], np.float32), a)
    assert "1/3 values differ" in message and "at [1]" in message
    assert conformance.compare(np.array([1, 2]), np.array([1, 3])).startswith("1/2 values differ")
    assert conformance.compare(np.array([np.nan], np.float32), np.array([np.nan], np.float32)) == ""


def test_unknown_op_in_the_selection_is_an_error() -> None:
    with pytest.raises(ValueError, match="no conformance case for"):
        cases.cases(["NoSuchOp"])


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_case_table_agrees_with_onnxruntime(case: cases.Case) -> None:
    """Each case is a valid ONNX model; where hetero knows the op, its reference agrees with onnxruntime."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    model = cases.build_model(case)
    onnx.checker.check_model(model, full_check=True)
    feeds = cases.make_feeds(case)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    if registry.find(case.domain, case.op) is None:
        return
    import hetero

    got = hetero.Session(model, backends=["reference"], on_fallback="error").run(feeds)
    for name, want in zip(session.get_outputs(), expected, strict=True):
        assert conformance.compare(got[name.name], want) == ""


def test_command_line_prints_pass_and_fail(site: Site) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "hetero.testing", "--backend", "reference", "--op", "Relu"],
        capture_output=True, text=True, timeout=120,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASS  reference  op Relu[7]" in ok.stdout and "0 failed" in ok.stdout

    site.add("hetero-tkit", {"tkit.py": textwrap.dedent(GOOD) + textwrap.dedent(BROKEN["wrong relu"][0])},
             {"tkit": "tkit"})
    bad = subprocess.run(
        [sys.executable, "-m", "hetero.testing", "--backend", "tkit", "--op", "Relu", "-q"],
        capture_output=True, text=True, timeout=120, env=site.subprocess_env(),
    )
    assert bad.returncode == 1
    assert "FAIL  tkit  op Relu[7]: output 0: " in bad.stdout
    assert "PASS" not in bad.stdout  # -q prints failures only


PYTEST_MODULE = """
import pytest


@pytest.mark.hetero_backend("reference")
def test_conformance(conformance_check):
    conformance_check()
"""


def test_pytest_plugin_makes_one_test_per_check(tmp_path: Path) -> None:
    (tmp_path / "test_backend.py").write_text(PYTEST_MODULE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",  # the kit's plugin loads via pytest11
         "--hetero-op", "Relu", "--hetero-op", "Softmax", str(tmp_path / "test_backend.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    softmax_known = registry.find("", "Softmax") is not None
    relu_and_contract = 7 + 2
    passed = relu_and_contract + (2 if softmax_known else 0)
    assert f"{passed} passed" in proc.stdout, proc.stdout + proc.stderr
    if not softmax_known:
        assert "2 skipped" in proc.stdout, proc.stdout
