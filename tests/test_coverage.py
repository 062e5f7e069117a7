"""The op coverage report, and docs/ops.md being its current output."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetero.coverage import SHIPPED_DOMAINS, coverage, markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "ops.md"


def test_reference_covers_every_op():
    cov = coverage()
    assert all(cells.get("reference") == "numpy" for _, _, cells in cov.rows)
    assert cov.count("reference", domain="") >= 150


def test_docs_ops_md_is_current():
    cov = coverage()
    # Other tests register ops of their own domains; the document covers the ones hetero ships.
    cov.rows = [row for row in cov.rows if row[0] in SHIPPED_DOMAINS]
    text = DOC.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| domain | op |"))
    documented = [cell.strip() for cell in header.strip("|").split("|")[2:]]
    if documented != cov.backends:
        pytest.skip(f"docs/ops.md covers backends {documented}; this machine has {cov.backends}")
    assert text == markdown(cov), "docs/ops.md is stale: regenerate it with `hetero ops --markdown > docs/ops.md`"
