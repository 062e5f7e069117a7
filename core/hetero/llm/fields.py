"""Typed, bounded access to a model file's settings: ``config.json`` keys or GGUF metadata, one reader for both.

Both formats hold the same Python values once parsed (bool, int, float, str; GGUF arrays as lists / numpy arrays),
so one reader serves them; only the words differ ("key" in a JSON file, "metadata" in a GGUF file). Every problem
names the file and the key, and every integer that sizes something is checked against ``files.LIMITS``.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..contract.errors import ModelFormatError
from .files import limit


class Fields:
    """``values[key]`` checked by type. ``arch`` fills ``{arch}`` in key names (GGUF's ``{arch}.block_count``)."""

    def __init__(self, values: Mapping[str, Any], path: Path | str, *, noun: str = "key", arch: str = "") -> None:
        self.values, self.path, self.noun, self.arch = values, path, noun, arch

    def key(self, name: str) -> str:
        return name.format(arch=self.arch) if "{" in name else name

    def __contains__(self, name: str) -> bool:
        return self.key(name) in self.values

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(self.key(name), default)

    def fail(self, name: str, expected: str) -> ModelFormatError:
        key = self.key(name)
        got = self.values.get(key, "<missing>")
        shown = repr(got) if not isinstance(got, str | int) or len(str(got)) < 200 else f"{str(got)[:80]}..."
        return ModelFormatError(f"{self.path}: {self.noun} {key!r} must be {expected}, got {shown}")

    def missing(self, name: str) -> ModelFormatError:
        return ModelFormatError(f"{self.path}: required {self.noun} {self.key(name)!r} is missing")

    def _value(self, name: str, default: Any) -> Any:
        value = self.values.get(self.key(name), default)
        if value is None:
            if default is None:
                raise self.missing(name)
            return default
        return value

    def int(self, name: str, default: int | None = None, *, minimum: int = 1, bound: str | None = None) -> int:
        """An integer >= ``minimum``; ``bound`` names its entry of ``files.LIMITS``."""
        value = self._value(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(name, "a positive integer" if minimum == 1 else f"an integer >= {minimum}")
        if bound is not None:
            limit(value, bound, f"{self.path}: {self.noun} {self.key(name)!r}")
        return int(value)

    def float(self, name: str, default: float | None = None, *, above: float | None = None) -> float:
        """A finite number (above ``above`` when given)."""
        value = self._value(name, default)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1 << 64:
            value = math.inf  # a 4000-digit integer: not a float anyone meant
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or (above is not None and value <= above):
            raise self.fail(name, "a finite number" if above is None else f"a finite number above {above:g}")
        return float(value)

    def bool(self, name: str, default: bool) -> bool:
        value = self.values.get(self.key(name))
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(name, "true or false")
        return value

    def str(self, name: str, default: str | None = None) -> str | None:
        value = self.values.get(self.key(name))
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.fail(name, "a string")
        return value

    # builtins.*: in the class body below, str and int name the methods above
    def token_id(self, name: builtins.str, vocab: builtins.int) -> builtins.int | None:
        value = self.values.get(self.key(name))
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
            raise self.fail(name, f"a token id in [0, {vocab})")
        return int(value)

    def token_ids(self, name: builtins.str) -> tuple[builtins.int, ...]:
        """A token id or a list of them (``eos_token_id``)."""
        value = self.values.get(self.key(name))
        if value is None:
            return ()
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31 for v in values):
            raise self.fail(name, "a token id or a list of them")
        return tuple(values)

    def object(self, name: builtins.str) -> dict[builtins.str, Any]:
        value = self.values.get(self.key(name))
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(name, "an object")
        return value
