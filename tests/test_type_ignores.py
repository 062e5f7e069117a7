"""Every `# type: ignore` in the repository names its error codes and says why: a bare one would hide every error on
its line, the next unrelated one included, and one without a reason cannot be judged when the code around it
changes. (mypy's ignore-without-code checks the code it type-checks; this covers tests, benchmarks and tools too.)"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("core", "plugins", "tests", "benchmarks", "examples", "scripts")
# `# type: ignore[code, code]  # why`, the form pyproject.toml's [tool.mypy] section describes.
WELL_FORMED = re.compile(r"#\s*type:\s*ignore\[[a-z][a-z-]*(,\s*[a-z][a-z-]*)*\]\s+#\s*\S")
IGNORE = re.compile(r"#\s*type:\s*ignore")


def python_files() -> list[Path]:
    skip = {"build", "build-dev", "__pycache__"}
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))
            if not skip & set(p.relative_to(ROOT).parts) and not any(part.startswith(".") for part in p.parts)]


def ignores_of(source: str) -> list[tuple[int, str]]:
    """(line, comment) of every type-ignore comment (comments only: strings that mention one do not count)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(tok.start[0], source.splitlines()[tok.start[0] - 1][tok.start[1]:])
            for tok in tokens if tok.type == tokenize.COMMENT and IGNORE.match(tok.string)]


def test_the_scan_tells_bare_from_explained() -> None:
    source = ("a = f()  # type: ignore\n"
              "b = g()  # type: ignore[attr-defined]\n"
              "c = h()  # type: ignore[attr-defined, arg-type]  # pybind module has no stubs\n"
              "s = '# type: ignore'\n")
    found = ignores_of(source)
    assert [line for line, _ in found] == [1, 2, 3]
    assert [bool(WELL_FORMED.match(comment)) for _, comment in found] == [False, False, True]


def test_every_type_ignore_names_its_codes_and_its_reason() -> None:
    files = python_files()
    assert len(files) > 100  # the scan found the repository
    bad = [f"{path.relative_to(ROOT)}:{line}: {comment}"
           for path in files for line, comment in ignores_of(path.read_text(encoding="utf-8"))
           if not WELL_FORMED.match(comment)]
    assert not bad, "write `# type: ignore[code]  # why` (or fix the type error):\n" + "\n".join(bad)
