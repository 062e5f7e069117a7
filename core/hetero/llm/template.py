"""Chat templates rendered with bounded time and memory.

A chat template is a program that comes with the model file (GGUF metadata or ``tokenizer_config.json``). jinja2's
sandbox stops it from touching Python internals but bounds no work: nested ``range(100000)`` loops ran 10**10 steps
and grew to 5.5 GB, and ``{% set s = s ~ s %}`` doubles a string per step. Here every render has a budget:

* steps: each loop iteration over ``range``, each operator, filter and call counts one (``MAX_STEPS``);
* size: strings and lists made by ``*``, ``+``, ``~``, filters and method calls, and the output, stay under
  ``max_chars`` (``MAX_OUTPUT_CHARS`` plus 8x the messages' own size); sizes are checked *before* ``*`` / ``**``
  compute, so the big value is never made;
* time: ``MAX_SECONDS`` of wall time, checked at each step.

Exceeding any of them raises ``TemplateLimitError``. ``hetero.llm.load`` renders the model's template once on a
small conversation, so a template that blows the budget is refused at load — unless the user asks for the plain
fallback format (``chat_template="plain"``).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from datetime import datetime
from typing import Any

from ..contract.errors import HeteroError

MAX_STEPS = 1_000_000  # a real template takes ~100 steps per message
MAX_OUTPUT_CHARS = 1 << 20
MAX_SECONDS = 5.0
MAX_POWER_BITS = 1 << 16  # ``a ** b``: results of at most 64 Kibit
PLAIN = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant: {% endif %}")
PROBE = [{"role": "user", "content": "Hello!"}]


class TemplateError(HeteroError):
    """The chat template refused the messages (its ``raise_exception``) or failed to render."""


class TemplateLimitError(TemplateError):
    """The chat template exceeded its budget of steps, size or time."""


class _Budget(threading.local):
    steps = 0
    deadline = 0.0
    max_chars = MAX_OUTPUT_CHARS
    where = ""

    def start(self, max_chars: int, where: str) -> None:
        self.steps, self.deadline, self.max_chars, self.where = 0, time.monotonic() + MAX_SECONDS, max_chars, where

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateLimitError(f"{self.where}: more than {MAX_STEPS} steps: refused (a runaway loop)")
        if not self.steps & 255 and time.monotonic() > self.deadline:
            raise TemplateLimitError(f"{self.where}: rendering took more than {MAX_SECONDS:g} s: refused")

    def size(self, value: Any, what: str) -> Any:
        if isinstance(value, str | list | tuple | bytes | dict) and len(value) > self.max_chars:
            raise TemplateLimitError(f"{self.where}: {what} made a value of {len(value)} items; at most "
                                     f"{self.max_chars} allowed")
        return value

    def count(self, n: int, what: str) -> None:
        if n > self.max_chars:
            raise TemplateLimitError(f"{self.where}: {what} would make {n} items; at most {self.max_chars} allowed")

    def number(self, value: Any, what: str) -> None:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > self.max_chars:
            raise TemplateLimitError(f"{self.where}: {what} got {value}; at most {self.max_chars} allowed")


_BUDGET = _Budget()


def _sized(x: Any) -> int:
    return len(x) if isinstance(x, str | list | tuple | bytes) else 0


def _environment() -> Any:
    from jinja2.compiler import CodeGenerator
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

    class BoundedCode(CodeGenerator):
        def visit_Concat(self, node: Any, frame: Any) -> None:  # ``a ~ b`` through the budget
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        code_generator_class = BoundedCode
        intercepted_binops = frozenset({"*", "**", "+", "%", "//", "/", "-"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _BUDGET.tick()
            if operator == "*" and (_sized(left) or _sized(right)):
                count = right if _sized(left) else left
                _BUDGET.number(count, "'*'")
                if isinstance(count, int):
                    _BUDGET.count(max(_sized(left), _sized(right)) * max(count, 0), "'*'")
            if operator == "**" and isinstance(right, int) and isinstance(left, int) and \
                    abs(right) * max(abs(left), 2).bit_length() > MAX_POWER_BITS:
                raise TemplateLimitError(f"{_BUDGET.where}: {left!r} ** {right!r} is too large: refused")
            if operator == "+" and _sized(left) + _sized(right) > _BUDGET.max_chars:
                raise TemplateLimitError(f"{_BUDGET.where}: '+' would make {_sized(left) + _sized(right)} items")
            return _BUDGET.size(super().call_binop(context, operator, left, right), f"{operator!r}")

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            _BUDGET.tick()
            for value in (*args, *kwargs.values()):
                _BUDGET.number(value, "a call")
            if getattr(__obj, "__name__", "") == "replace" and isinstance(getattr(__obj, "__self__", None), str) \
                    and len(args) >= 2 and isinstance(args[1], str):
                text, old = __obj.__self__, args[0]
                grows = (text.count(old) if old else len(text) + 1) * len(args[1])
                _BUDGET.count(len(text) + grows, "str.replace")
            return _BUDGET.size(super().call(__context, __obj, *args, **kwargs), "a call")

        def bounded_concat(self, parts: tuple[Any, ...]) -> str:
            _BUDGET.tick()
            if sum(_sized(p) for p in parts) > _BUDGET.max_chars:
                raise TemplateLimitError(f"{_BUDGET.where}: '~' would make a string over {_BUDGET.max_chars}")
            return _BUDGET.size("".join(str(p) for p in parts), "'~'")

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def counted_range(*args: Any) -> Any:
        for value in safe_range(*args):
            _BUDGET.tick()
            yield value

    def bounded(filter_fn: Any) -> Any:
        @functools.wraps(filter_fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            _BUDGET.tick()
            for value in (*args[1:], *kwargs.values()):
                _BUDGET.number(value, f"filter {filter_fn.__name__!r}")
            return _BUDGET.size(filter_fn(*args, **kwargs), f"filter {filter_fn.__name__!r}")
        return run

    env.filters["tojson"] = _tojson
    env.filters = {name: bounded(f) for name, f in env.filters.items()}
    env.globals["range"] = counted_range
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template: {message}")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_ENV: list[Any] = []
_COMPILED: dict[str, Any] = {}


def _compile(source: str, where: str) -> Any:
    compiled = _COMPILED.get(source)
    if compiled is None:
        from jinja2 import TemplateError as JinjaError

        if not _ENV:
            _ENV.append(_environment())
        try:
            compiled = _ENV[0].from_string(source)
        except (JinjaError, RecursionError, MemoryError, ValueError) as exc:
            raise TemplateError(f"{where} does not compile: {exc}") from None
        if len(_COMPILED) > 64:
            _COMPILED.clear()
        _COMPILED[source] = compiled
    return compiled


def render_template(template: str, messages: list[dict[str, Any]], *, where: str = "the chat template",
                    **context: Any) -> str:
    """Render a chat template in the bounded sandbox with the names Hugging Face templates use
    (``raise_exception``, ``tojson``, ``strftime_now``), blocks trimmed as transformers does."""
    compiled = _compile(template, where)
    size = len(json.dumps(messages, default=str)) + len(json.dumps(context, default=str))
    _BUDGET.start(MAX_OUTPUT_CHARS + 8 * size, where)
    out: list[str] = []
    total = 0
    try:
        for piece in compiled.generate(messages=messages, **context):
            _BUDGET.tick()
            total += len(piece)
            if total > _BUDGET.max_chars:
                raise TemplateLimitError(f"{where}: the output passed {_BUDGET.max_chars} characters: refused")
            out.append(piece)
    except TemplateError:
        raise
    except RecursionError:
        raise TemplateLimitError(f"{where}: recursion too deep: refused") from None
    except Exception as exc:  # jinja2 errors and template type errors alike
        raise TemplateError(f"{where} failed: {type(exc).__name__}: {exc}") from None
    return "".join(out)


class ChatTemplate:
    """A model's chat template with its special tokens; ``render`` is ``apply_chat_template(tokenize=False)``."""

    def __init__(self, source: str, where: str = "the chat template", *, bos_token: str | None = None,
                 eos_token: str | None = None) -> None:
        self.source, self.where = source, where
        self.bos_token, self.eos_token = bos_token or "", eos_token or ""

    @classmethod
    def plain(cls) -> ChatTemplate:
        """``role: content`` lines: the fallback a user may ask for when a model's template is refused."""
        return cls(PLAIN, "the plain chat format")

    @property
    def is_plain(self) -> bool:
        return self.source == PLAIN

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, **kwargs: Any) -> str:
        return render_template(self.source, messages, where=self.where, add_generation_prompt=add_generation_prompt,
                               **{"bos_token": self.bos_token, "eos_token": self.eos_token, **kwargs})

    def probe(self) -> None:
        """Render a one-message conversation: a template that exceeds the budget is refused now, at load. Other
        failures (a template that refuses this conversation, or does not compile) wait for ``chat``."""
        try:
            self.render(PROBE)
        except TemplateLimitError as exc:
            raise TemplateLimitError(exc.message, hint="load with chat_template='plain' to use a plain "
                                     "'role: content' format instead") from None
        except TemplateError:
            pass
