"""The conformance kit: the reference passes it, and deliberately broken throwaway backends are caught by it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hetero.contract import registry
from hetero.testing import cases, conformance, pytest_plugin
from hetero.testing.dist import Site, plugin_site


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    with plugin_site(tmp_path) as s:
        yield s


def test_reference_passes_every_check() -> None:
    report = conformance.check_backend("reference")
    assert report.ok, str(report)
    with_schema = [c for c in cases.CASES if registry.find(c.domain, c.op) is not None]
    contract = [r for r in report.results if r.check.startswith("contract: ")]
    not_passed = [r.check for r in contract if r.status != conformance.PASS]
    assert not_passed == ["contract: bind() does what run() does, in place"]  # the reference kernels do not bind
    assert report.count(conformance.PASS) == len(contract) - 1 + len(with_schema)
    skipped_ops = [r for r in report.results if r.status == conformance.SKIP and r.check.startswith("op ")]
    assert all("no schema" in r.reason for r in skipped_ops), skipped_ops  # the reference claims every op it knows


# A correct host-memory table backend with Relu (which also binds) and Add; each variant below breaks one thing.
GOOD = """
    import functools
    from typing import ClassVar

    import numpy as np

    from hetero.contract import SUPPORTED, Device, Factory, HostMemory, KernelTableBackend, Support, Tensor, hookimpl

    api_version = "2.0"


    class Relu:
        def __init__(self, node, backend):
            pass

        def prepare(self, inputs, outputs):
            pass

        def run(self, inputs, outputs):
            np.maximum(inputs[0].numpy(), 0, out=outputs[0].numpy())

        def bind(self, inputs, outputs):
            return functools.partial(np.maximum, inputs[0].numpy(), 0, out=outputs[0].numpy())


    class Add(Relu):
        bind = None

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
    "kernel rebinds its output buffer": (
        """
        class AllocatingRelu(Relu):  # the bug: allocates a result and hangs it on the output tensor
            def run(self, inputs, outputs):
                outputs[0].buffer = np.maximum(inputs[0].numpy(), 0)

        TBackend.kernels = {**TBackend.kernels, ("", "Relu"): AllocatingRelu}
        """,
        {"kernels prepare/run": "rebound outputs[0].buffer instead of writing into it"},
    ),
    "kernel replaces its output tensor": (
        """
        class ReplacingAdd(Add):  # the bug: puts a new tensor in the outputs list
            def run(self, inputs, outputs):
                outputs[0] = Tensor.from_numpy(inputs[0].numpy() + inputs[1].numpy())

        TBackend.kernels = {**TBackend.kernels, ("", "Add"): ReplacingAdd}
        """,
        {"kernels prepare/run": "replaced outputs[0] with a new tensor"},
    ),
    "kernel writes into its input": (
        """
        class InPlaceRelu(Relu):  # the bug: uses its input as scratch memory
            def run(self, inputs, outputs):
                x = inputs[0].numpy()
                np.maximum(x, 0, out=x)
                outputs[0].numpy()[...] = x

        TBackend.kernels = {**TBackend.kernels, ("", "Relu"): InPlaceRelu}
        """,
        {"inputs unchanged": "run() wrote into input 0"},
    ),
    "prepare works once only": (
        """
        class PlanOnceAdd(Add):  # the bug: a second prepare (new shapes) is refused
            def prepare(self, inputs, outputs):
                if getattr(self, "planned", False):
                    raise RuntimeError("PlanOnceAdd was prepared twice")
                self.planned = True

        TBackend.kernels = {**TBackend.kernels, ("", "Add"): PlanOnceAdd}
        """,
        {"kernels prepare/run": "prepared twice"},
    ),
    "bind does something else": (
        """
        def bind_abs(self, inputs, outputs):  # the bug: the bound call computes |x|, run() max(x, 0)
            return functools.partial(np.abs, inputs[0].numpy(), out=outputs[0].numpy())

        Relu.bind = bind_abs
        """,
        {"bind()": "output 0 bound call: "},
    ),
    "bind returns no callable": (
        """
        Relu.bind = lambda self, inputs, outputs: "np.maximum"
        """,
        {"bind()": "bind() returned str, not a callable, a list of callables"},
    ),
    "memory_domain set per instance": (
        """
        def init(self, device, options=None):
            KernelTableBackend.__init__(self, device, options)
            self.memory_domain = f"host:{device.name}"

        TBackend.__init__ = init
        """,
        {"create()": "memory_domain is set on the instance"},
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
    assert all(r.status == conformance.PASS for r in report.results if r.check.startswith("contract: "))
    assert by_check["contract: bind() does what run() does, in place"].reason == "2 bound kernels"  # the Relu cases
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


def documented_test_module(backend: str) -> str:
    """The test module pytest_plugin's docstring shows, verbatim but for the backend's name."""
    doc = pytest_plugin.__doc__ or ""
    block = doc.split("A test module of the backend package::\n", 1)[1].split("\n\n``pytest", 1)[0]
    assert '@pytest.mark.hetero_backend("mybackend")' in block
    return textwrap.dedent(block).replace("mybackend", backend)


def run_pytest(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )


def test_pytest_plugin_makes_one_test_per_check(tmp_path: Path) -> None:
    (tmp_path / "test_backend.py").write_text(documented_test_module("reference"))
    proc = run_pytest(tmp_path, "--hetero-op", "Relu", "--hetero-op", "Softmax", "test_backend.py")
    softmax_known = registry.find("", "Softmax") is not None
    contract = sum(check.name.startswith("contract: ") for check in conformance.plan(["Relu"]))
    passed = contract - 1 + 2 + (2 if softmax_known else 0)  # the reference does not bind; two Relu cases
    assert f"{passed} passed, {1 if softmax_known else 3} skipped" in proc.stdout, proc.stdout + proc.stderr


def test_pytest_plugin_loads_with_dash_p_when_autoloading_is_off(tmp_path: Path) -> None:
    (tmp_path / "test_backend.py").write_text(documented_test_module("reference"))
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    without = run_pytest(tmp_path, "--hetero-op", "Relu", "test_backend.py", env=env)
    assert without.returncode != 0 and "unrecognized arguments: --hetero-op" in without.stderr  # the plugin is off
    proc = run_pytest(tmp_path, "-p", "hetero.testing.pytest_plugin", "--hetero-op", "Relu", "test_backend.py",
                      env=env)
    assert proc.returncode == 0 and " passed, 1 skipped" in proc.stdout, proc.stdout + proc.stderr


def test_listing_the_plugin_in_pytest_plugins_is_the_mistake_the_docs_warn_of(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["hetero.testing.pytest_plugin"]\n')
    (tmp_path / "test_backend.py").write_text(documented_test_module("reference"))
    proc = run_pytest(tmp_path, "--hetero-op", "Relu", "test_backend.py")
    assert proc.returncode != 0 and "already registered" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
