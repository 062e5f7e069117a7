"""``hetero chat``: a read-eval-print loop over ``Llm.chat``.

On a terminal the prompt is read with readline (line editing, and history kept across sessions in
``$HETERO_CACHE_DIR/chat_history``, default ``~/.cache/hetero/chat_history``). Input that spans lines: a line ending
in a backslash continues on the next (llama.cpp's habit), and a block between two ``\"\"\"`` lines is one message
(Ollama's). Lines starting with ``/`` are commands, never sent to the model: ``/help``, ``/reset`` (``/clear``),
``/bye`` and ``/exit`` (``/quit``). Ctrl-D or Ctrl-C at the prompt ends the chat; Ctrl-C while the model answers
stops the answer and keeps the conversation. Piped input is read the same way, one message per line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from ..cli_errors import error_message
from ..contract.errors import HeteroError
from .cli_generation import Loaded, print_stats, prompt_cache_options, sampling, stream_out

BLOCK = '"""'
HELP = """commands (never sent to the model):
  /help            this list
  /reset, /clear   forget the conversation (the system prompt stays)
  /bye, /exit      leave (Ctrl-D or Ctrl-C at the prompt too)
multi-line input: end a line with \\ to continue it, or put the message between two \"\"\" lines
Ctrl-C while the model answers stops the answer"""
EXIT_COMMANDS = ("/bye", "/exit", "/quit")
RESET_COMMANDS = ("/reset", "/clear")
HISTORY_LENGTH = 1000


def history_path() -> Path:
    base = os.environ.get("HETERO_CACHE_DIR")
    root = Path(base) if base else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hetero"
    return root / "chat_history"


class _Input:
    """Lines from readline on a terminal, or from a stream; None at the end of input."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream is sys.stdin and stream.isatty() and sys.stdout.isatty()
        self.readline: Any = None
        if self.tty:
            try:
                import readline
            except ImportError:  # a Python without readline (some Windows builds): plain input() still works
                return
            self.readline = readline
            readline.set_history_length(HISTORY_LENGTH)
            with contextlib.suppress(OSError, ValueError):  # no history yet
                readline.read_history_file(history_path())

    def line(self, prompt: str) -> str | None:
        if self.tty:
            try:
                return input(prompt)
            except EOFError:
                return None
        if self.stream.isatty():  # typed at a terminal while stdout goes elsewhere: the prompt goes to stderr
            sys.stderr.write(prompt)
            sys.stderr.flush()
        line = self.stream.readline()
        return line.rstrip("\n") if line else None

    def save(self) -> None:
        if self.readline is None:
            return
        try:
            history_path().parent.mkdir(parents=True, exist_ok=True)
            self.readline.write_history_file(history_path())
        except OSError:
            pass  # a read-only home only costs the history


class ChatRepl:
    def __init__(self, loaded: Loaded, args: Any, stdin: TextIO) -> None:
        self.loaded, self.llm, self.args = loaded, loaded.llm, args
        self.input = _Input(stdin)
        self.system = [{"role": "system", "content": args.system}] if args.system else []
        self.messages: list[dict[str, str]] = list(self.system)
        self.template = {"enable_thinking": False} if args.no_think else {}
        # --prompt-cache: the chat's first prompt (the system prompt and first message) is loaded / saved
        self.prompt_cache = prompt_cache_options(args)

    def run(self) -> int:
        print(f"hetero chat with {self.llm.name}: /help for help, /bye to leave, \"\"\" or \\ for multi-line input",
              file=sys.stderr)
        try:
            while True:
                try:
                    text = self.read_message()
                except KeyboardInterrupt:  # at the prompt: leave, on a line of its own
                    print(file=sys.stderr)
                    return 0
                if text is None:
                    if self.input.tty:
                        print(file=sys.stderr)  # Ctrl-D leaves the cursor after the prompt
                    return 0
                if not text.strip():
                    continue
                if text.lstrip().startswith("/"):
                    if not self.command(text.strip()):
                        return 0
                else:
                    self.answer(text)
        finally:
            self.input.save()

    def drop_old_turns(self) -> None:
        """Forget the oldest turns (the system message stays) while the conversation leaves less than a quarter of
        the context for the reply, so that a long chat keeps going instead of failing on a full context."""
        llm, dropped = self.llm, 0
        if llm.template is None or llm.tokenizer is None:
            return
        while len(self.messages) > len(self.system) + 1:
            text = llm.template.render(self.messages, add_generation_prompt=True, **self.template)
            if len(llm.tokenize(text, add_special_tokens=False)) <= llm.context * 3 // 4:
                break
            first = len(self.system)
            # a user message and the reply to it go together
            count = 2 if self.messages[first + 1:first + 2] and self.messages[first + 1]["role"] != "user" else 1
            del self.messages[first:first + count]
            dropped += count
        if dropped:
            print(f"(the context of {llm.context} tokens is nearly full: the oldest {dropped} message(s) were "
                  "dropped)", file=sys.stderr)

    def read_message(self) -> str | None:
        """One message: a line, lines joined by trailing backslashes, or a \"\"\" block; None at the end of input."""
        line = self.input.line(">>> ")
        if line is None:
            return None
        if line.strip().startswith(BLOCK):
            first = line.strip()[len(BLOCK):]
            if first.endswith(BLOCK):  # """one line"""
                return first[:-len(BLOCK)]
            lines = [first] if first else []
            while (more := self.input.line("... ")) is not None:
                if more.rstrip().endswith(BLOCK):
                    lines.append(more.rstrip()[:-len(BLOCK)])
                    break
                lines.append(more)
            return "\n".join(lines).strip("\n")
        lines = []
        while line is not None and line.endswith("\\"):
            lines.append(line[:-1])
            line = self.input.line("... ")
        lines.append(line or "")
        return "\n".join(lines)

    def command(self, text: str) -> bool:
        """Run a /command; False when the chat should end."""
        word = text.split()[0].lower()
        if word in EXIT_COMMANDS:
            return False
        if word in RESET_COMMANDS:
            self.messages = list(self.system)
            self.llm.reset()
            print("(conversation cleared)", file=sys.stderr)
        elif word in ("/help", "/?"):
            print(HELP, file=sys.stderr)
        else:
            print(f"unknown command {word}: /help lists them (to send text that starts with /, put it in a "
                  f'{BLOCK} block)', file=sys.stderr)
        return True

    def answer(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        self.drop_old_turns()
        overrides = sampling(self.args)
        reply: list[str] = []

        def kept(pieces: Iterator[str]) -> Iterator[str]:
            for piece in pieces:
                reply.append(piece)
                yield piece

        started = time.perf_counter()
        first = None
        try:
            first = stream_out(kept(self.llm.chat(self.messages, self.args.max_new_tokens, stream=True,
                                                  stop=self.args.stop, template_kwargs=self.template,
                                                  spec=self.loaded.spec, **self.prompt_cache, **overrides)),
                               started)
            self.prompt_cache = {}  # later turns reuse the model's own cache
        except KeyboardInterrupt:
            print("\n[stopped]", file=sys.stderr)
        except HeteroError as exc:  # e.g. the context is full: say so and keep the chat open
            self.messages.pop()
            print(f"hetero: error: {error_message(exc)}", file=sys.stderr)
            return
        self.messages.append({"role": "assistant", "content": "".join(reply)})
        print_stats(self.loaded, overrides, first)
