"""hetero-hexagon's tests: the plugin from the checkout when it is not installed (plugins/hexagon), and the
``hexagon`` fixture that makes it discoverable and skips, with the reason, where the QNN toolkit venv is missing
(``python -m hetero_hexagon setup``, or HETERO_QNN_VENV pointing to a venv with onnxruntime-qnn)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from hetero import plugins
from hetero.testing.dist import plugin_site

if importlib.util.find_spec("hetero_hexagon") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "plugins" / "hexagon"))

# The test run moves HETERO_CACHE_DIR to a temporary folder (tests/conftest.py), and the QNN venv's default place is
# under it: pin the venv that exists now, before that happens.
if "HETERO_QNN_VENV" not in os.environ:
    from hetero_hexagon.qnn import QNN_ENV

    if QNN_ENV.python.exists():
        os.environ["HETERO_QNN_VENV"] = str(QNN_ENV.path)


def register_hexagon(site) -> None:
    """Make the hexagon entry point visible where the distribution is not installed (a checkout)."""
    if plugins.status("hexagon") is None:
        site.add("hetero-hexagon", {}, {"hexagon": "hetero_hexagon.plugin"})
        site.reload()


@pytest.fixture(scope="module")
def hexagon_site(tmp_path_factory):
    """A plugin site with hexagon registered, for one test module (probing starts the QNN venv's Python)."""
    with plugin_site(tmp_path_factory.mktemp("hexagon")) as site:
        register_hexagon(site)
        yield site


@pytest.fixture
def hexagon(hexagon_site):
    """The hexagon backend's status row, ok; skips with its reason otherwise."""
    row = plugins.status("hexagon")
    if row is None or not row.ok:  # a test may have probed with another HETERO_QNN_VENV: ask again
        plugins.reload()
        row = plugins.status("hexagon")
    if row is None or not row.ok:
        pytest.skip(f"hexagon backend: {row.reason} ({row.hint})" if row else "hexagon backend: not installed")
    return row
