"""A pytest plugin: the conformance kit as one pytest test per check.

Installing hetero registers this plugin with pytest (the ``pytest11`` entry point ``hetero``), so a backend
package's tests need no setup to use it. Do not list it in ``pytest_plugins``: pytest would load it a second time
and stop with "Plugin already registered under a different name". Where plugin autoloading is off
(``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``), load it with ``pytest -p hetero.testing.pytest_plugin``.

A test module of the backend package::

    import pytest


    @pytest.mark.hetero_backend("mybackend")
    def test_conformance(conformance_check):
        conformance_check()

``pytest --hetero-backend NAME`` (repeatable) checks the named backends instead of the marked one, and
``--hetero-op OP`` (repeatable) limits the op checks. The ``hetero_site`` fixture gives a folder for throwaway
plugin distributions (see ``hetero.testing.dist``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from . import conformance
from .dist import Site, plugin_site


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--hetero-backend", action="append", default=[], metavar="NAME",
        help="backend the conformance_check tests run against (repeatable)",
    )
    parser.addoption("--hetero-op", action="append", default=None, metavar="OP", help="limit the op checks")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hetero_backend(name): the backend conformance_check tests run against")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_check" not in metafunc.fixturenames:
        return
    backends = metafunc.config.getoption("--hetero-backend") or [
        m.args[0] for m in metafunc.definition.iter_markers("hetero_backend")
    ]
    if not backends:
        raise pytest.UsageError("conformance_check needs --hetero-backend NAME or @pytest.mark.hetero_backend(NAME)")
    checks = conformance.plan(metafunc.config.getoption("--hetero-op"))
    params = [(backend, check) for backend in backends for check in checks]
    ids = [f"{backend}: {check.name}" for backend, check in params]
    metafunc.parametrize("conformance_check", params, ids=ids, indirect=True)


@pytest.fixture(scope="session")
def _hetero_contexts() -> Iterator[dict[str, conformance.Context]]:
    # One backend instance per backend for the whole run, as in check_backend.
    contexts: dict[str, conformance.Context] = {}
    yield contexts
    for ctx in contexts.values():
        ctx.close()


@pytest.fixture
def conformance_check(
    request: pytest.FixtureRequest, _hetero_contexts: dict[str, conformance.Context]
) -> Callable[[], None]:
    backend, check = request.param
    ctx = _hetero_contexts.setdefault(backend, conformance.Context(backend))

    def run() -> None:
        result = check.run(ctx)
        if result.status == conformance.SKIP:
            pytest.skip(result.reason)
        if result.status == conformance.FAIL:
            pytest.fail(f"{result.check}: {result.reason}", pytrace=False)

    return run


@pytest.fixture
def hetero_site(tmp_path: Path) -> Iterator[Site]:
    """A folder for throwaway plugin distributions, on sys.path for the test (see ``hetero.testing.dist``)."""
    with plugin_site(tmp_path) as site:
        yield site
