"""``hetero serve``: an OpenAI-compatible HTTP server for an LLM (``pip install 'hetero[serve]'``).

``create_app(models)`` builds the ASGI app (``app``), ``run(...)`` serves it with uvicorn. See docs/serving.md.
"""

from __future__ import annotations

from typing import Any

from ..contract.errors import HeteroError

__all__ = ["create_app", "run"]


def _require() -> None:
    missing = []
    for module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise HeteroError(f"serving needs {', '.join(missing)}", hint="pip install 'hetero[serve]'")


def create_app(models: list[Any], **options: Any) -> Any:
    _require()
    from .app import create_app as build

    return build(models, **options)


def run(models: list[Any], *, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info",
        **options: Any) -> None:
    """Serve ``models`` until interrupted (Ctrl-C)."""
    app = create_app(models, **options)
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
