"""The rknn backend's tests. Those that convert and simulate need Rockchip's rknn-toolkit2 in its own venv
(``python -m hetero_rknn setup``, or ``HETERO_RKNN_VENV`` pointing to one; ``.ci/rknn`` makes it in CI) and skip
without it, naming what is missing. The rest (op support, ONNX export, options, a missing or broken toolkit) run
everywhere hetero-rknn is installed."""

from __future__ import annotations

import importlib.util
import os

import pytest

from hetero.contract import BackendUnavailable


def toolkit_missing() -> str | None:
    if importlib.util.find_spec("hetero_rknn") is None:
        return "hetero-rknn is not installed (pip install ./plugins/rknn)"
    from hetero_rknn.toolkit import SETUP_COMMAND, TOOLKIT_ENV, simulated_on_this_machine

    why = simulated_on_this_machine()
    if why is not None:
        return f"no RKNN simulator on this machine: {why}"
    try:
        TOOLKIT_ENV.check()
    except BackendUnavailable as exc:
        return f"rknn-toolkit2 is not set up ({exc.message}): run {SETUP_COMMAND}"
    return None


needs_plugin = pytest.mark.skipif(importlib.util.find_spec("hetero_rknn") is None,
                                  reason="hetero-rknn is not installed (pip install ./plugins/rknn)")
TOOLKIT_MISSING = toolkit_missing()
needs_toolkit = pytest.mark.skipif(TOOLKIT_MISSING is not None, reason=TOOLKIT_MISSING or "")


@pytest.fixture
def rknn_cache(tmp_path, monkeypatch):
    """A fresh cache folder for built models; the toolkit venv stays where it is (its default is under the cache)."""
    from hetero_rknn.toolkit import ENV_VAR, TOOLKIT_ENV

    monkeypatch.setenv(ENV_VAR, os.fspath(TOOLKIT_ENV.path))
    monkeypatch.setenv("HETERO_CACHE_DIR", os.fspath(tmp_path))
    return tmp_path / "rknn"
