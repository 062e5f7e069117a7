"""The ONNX node test suite, run through ``hetero.Session`` on one backend.

    pytest tests/onnx_conformance -m conformance --backend reference -q

One test per node case (built once by onnx's loader and cached, see cases.py). Cases listed in
``expected_failures.toml`` for the backend are xfailed with their reason; cases using an op hetero has no schema for
are skipped as "not-supported". The run ends with one summary line per backend.
"""

from __future__ import annotations

import fnmatch
import sys
from collections import Counter
from pathlib import Path

import pytest

from .cases import NodeCase, load_cases

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest itself depends on tomli before 3.11
    import tomli as tomllib

HERE = Path(__file__).parent
NOT_SUPPORTED = "not-supported"

_counts: Counter[str] = Counter()
_backend_seen: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hetero conformance")
    group.addoption("--backend", default="reference", help="hetero backend the ONNX node tests run on")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: the ONNX node conformance suite (select with -m conformance)")


def expected_failures(backend: str) -> list[tuple[str, str]]:
    """(glob pattern, reason) pairs for ``backend``: its own section first, then [all]."""
    with (HERE / "expected_failures.toml").open("rb") as f:
        table = tomllib.load(f)
    sections = [table.get(backend, {}), table.get("all", {})]
    return [(pattern, str(reason)) for section in sections for pattern, reason in section.items()]


def expected_reason(backend: str, name: str) -> str | None:
    for pattern, reason in expected_failures(backend):
        if fnmatch.fnmatchcase(name, pattern):
            return reason
    return None


_CASES: list[NodeCase] | None = None


def all_cases() -> list[NodeCase]:
    global _CASES
    if _CASES is None:
        _CASES = load_cases()
    return _CASES


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "node_case" not in metafunc.fixturenames:
        return
    backend = metafunc.config.getoption("--backend")
    if backend not in _backend_seen:
        _backend_seen.append(backend)
    params = []
    for case in all_cases():
        marks = []
        reason = expected_reason(backend, case.name)
        if reason is not None:
            marks.append(pytest.mark.xfail(reason=reason, strict=False))
        params.append(pytest.param(case, id=case.name, marks=marks))
    metafunc.parametrize("node_case", params)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    return request.config.getoption("--backend")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "onnx_conformance" not in report.nodeid:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        if hasattr(report, "wasxfail"):
            _counts["passed" if report.outcome == "passed" else "expected-fail"] += 1
        elif report.skipped:
            reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else ""
            _counts[NOT_SUPPORTED if NOT_SUPPORTED in reason else "skipped"] += 1
        elif report.failed:
            _counts["failed"] += 1
        elif report.passed:
            _counts["passed"] += 1
            if dict(report.user_properties).get("native"):
                _counts["native"] += 1


def pytest_terminal_summary(terminalreporter) -> None:
    if not _counts:
        return
    for backend in _backend_seen:
        line = (
            f"onnx node tests [{backend}]: {_counts['passed']} passed ({_counts['native']} on native kernels alone), "
            f"{_counts['failed']} failed, "
            f"{_counts['expected-fail']} expected-fail, {_counts[NOT_SUPPORTED]} not-supported"
        )
        if _counts["skipped"]:
            line += f", {_counts['skipped']} skipped"
        terminalreporter.write_line(line)
