"""``hetero chat`` and ``hetero generate`` / ``run`` on LLMs as a user meets them: on a pseudo-terminal (line editing,
history, multi-line input, commands, Ctrl-C / Ctrl-D) and through pipes."""

from __future__ import annotations

import io
import re
import sys
from types import SimpleNamespace

import pytest
from cli_terminal import Terminal, run_cli

from hetero.llm.repl import ChatRepl

from .helpers import FIXTURES

GGUF = FIXTURES.parent / "gguf" / "qwen3-q8_0.gguf"
MODEL = str(FIXTURES / "qwen3")
STATS = r"\[model .* generated \d+ tokens"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals need a POSIX system")


def chat(tmp_path, *extra: str) -> Terminal:
    return Terminal(["chat", MODEL, "-n", "3", "--temp", "0", *extra], HETERO_CACHE_DIR=str(tmp_path))


def test_chat_on_a_terminal(tmp_path):
    term = chat(tmp_path)
    try:
        term.expect(">>> ")
        term.send("/help\r")  # a command: answered by hetero, never sent to the model
        term.expect(r"/reset, /clear")
        term.expect(">>> ")
        term.send("Hello there\r")
        first = term.expect(r"prompt (\d+) tokens \(0 cached\)")
        term.expect(">>> ")
        term.send("\x1b[A")  # up-arrow: the last message, from readline's history
        term.expect("Hello there")
        term.send("\r")
        again = term.expect(r"prompt (\d+) tokens \((\d+) cached\)")
        assert int(again.group(2)) > 0 and int(again.group(1)) > int(first.group(1))  # a second turn, cached
        term.expect(">>> ")
        term.send('"""\rline one\rline two\r"""\r')  # one message over three lines
        term.expect(r"\.\.\. line two")
        term.expect(STATS)
        term.expect(">>> ")
        term.send("/reset\r")
        term.expect(r"conversation cleared")
        term.send("/frobnicate\r")
        term.expect(r"unknown command /frobnicate")
        term.send("/bye\r")
        assert term.wait() == 0
    finally:
        term.close()
    assert len(re.findall(STATS, term.output)) == 3  # /help, /reset, /frobnicate and /bye were not sent
    assert "Hello there" in (tmp_path / "chat_history").read_text(encoding="utf-8")


@pytest.mark.parametrize("key", ["\x04", "\x03"], ids=["ctrl-d", "ctrl-c"])
def test_chat_leaves_cleanly_at_the_prompt(tmp_path, key):
    term = chat(tmp_path)
    try:
        term.expect(">>> ")
        term.send(key)
        if key == "\x03":
            # CPython's readline loop checks signals only when its select() is interrupted: a SIGINT that lands
            # after the prompt is drawn but before select() starts waits for the next key (a person's Ctrl-C never
            # comes that early; this test's, sent the moment the prompt shows, did on a loaded machine). A second
            # Ctrl-C then leaves, as it does for a person.
            for _ in range(20):
                if term.exited(2.0):
                    break
                term.send(key)
        assert term.wait() == 0
    finally:
        term.close()
    assert term.output.endswith("\r\n")  # the shell's prompt starts on a line of its own
    assert "Traceback" not in term.output and "KeyboardInterrupt" not in term.output


def test_chat_reads_multi_line_messages_from_a_pipe(tmp_path):
    args = SimpleNamespace(system=None, no_think=False)
    repl = ChatRepl(SimpleNamespace(llm=None), args, io.StringIO(
        'one \\\ntwo\n"""\nblock line 1\n/not a command\n"""\n"""inline"""\n/bye\n'))
    assert repl.read_message() == "one \ntwo"
    assert repl.read_message() == "block line 1\n/not a command"
    assert repl.read_message() == "inline"
    assert repl.read_message() == "/bye"
    assert repl.read_message() is None


def test_chat_through_a_pipe():
    result = run_cli(["chat", MODEL, "-n", "3", "--temp", "0"], stdin="Hello\n/help\nHow are you?\n/exit\nignored\n")
    assert result.returncode == 0, result.stderr
    assert len(re.findall(STATS, result.stderr)) == 2 and "/reset, /clear" in result.stderr


def test_generate_says_it_reads_stdin_on_a_terminal(tmp_path):
    term = Terminal(["generate", "-m", MODEL, "-n", "3", "--temp", "0"], HETERO_CACHE_DIR=str(tmp_path))
    try:
        term.expect(r"reading the prompt from stdin \(end it with Ctrl-D")
        term.send("Hello\r\x04")
        term.expect(STATS)
        assert term.wait() == 0
    finally:
        term.close()


@pytest.mark.parametrize("args", [
    ["generate", "-m", str(GGUF), "-p", "The quick brown fox"],  # llama.cpp's spelling
    ["generate", "-m", str(GGUF), "The quick brown fox"],
    ["generate", str(GGUF), "The quick brown fox"],
    ["run", str(GGUF), "The quick brown fox"],  # Ollama's: run dispatches on the file's kind
    ["run", str(GGUF), "-c", "64", "The quick brown fox"],  # the prompt after flags
], ids=["-m -p", "-m prompt", "model prompt", "run", "run flags prompt"])
def test_llama_cpp_and_ollama_spellings_generate(args):
    result = run_cli([*args, "-n", "4", "--temp", "0", "-c", "64"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert len(result.stderr.strip().splitlines()) == 1  # piped: the stats line only, no progress
    stats = result.stderr.strip().splitlines()[-1]
    assert re.match(r"\[model \d+\.\d MiB Q8_0, loaded in \d+\.\d\d s \| prompt \d+ tokens \(0 cached\), "
                    r"[\d.]+ t/s, first token after \d+\.\d\d s \| generated \d+ tokens, [\d.]+ t/s \| sampling "
                    r"greedy \(--temp 0\)\]$", stats), stats


def test_the_stats_line_names_the_sampling_in_force():
    result = run_cli(["generate", "-m", str(GGUF), "-p", "Hi", "-n", "2", "-c", "64", "--temp", "0.7", "--top-k",
                      "20", "--seed", "3"])
    assert result.returncode == 0, result.stderr
    assert re.search(r"sampling temp 0\.7 top-k 20 .*seed 3 \(flags", result.stderr), result.stderr


def test_a_full_context_hint_speaks_the_command_line():
    result = run_cli(["generate", "-m", str(GGUF), "-p", "word " * 40, "-n", "2", "-c", "16"])
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("hetero: error: ") and "-c N" in line and "context=" not in line


def test_onnx_flags_on_an_llm_are_an_error():
    result = run_cli(["run", str(GGUF), "hi", "-i", "x=y.npy"])
    assert result.returncode == 2
    assert result.stderr.strip() == f"hetero: error: {GGUF} is an LLM: -i apply to ONNX models (give a prompt)"


def test_ctrl_c_stops_an_answer_and_keeps_the_chat(tmp_path):
    term = Terminal(["chat", MODEL, "-n", "3500", "--temp", "0.8", "--seed", "1"], HETERO_CACHE_DIR=str(tmp_path))
    try:
        term.expect(">>> ")
        term.send("Tell me a long story\r")
        term.expect(r"Tell me a long story\r\n")
        term._read(1.0)  # the answer has started
        term.send("\x03")
        term.expect(r"\[stopped\]")
        term.expect(">>> ")
        term.send("/bye\r")
        assert term.wait() == 0
    finally:
        term.close()
    assert "Traceback" not in term.output


def test_run_without_a_prompt_chats_on_a_terminal(tmp_path):
    term = Terminal(["run", str(GGUF), "-c", "64", "-n", "2"], HETERO_CACHE_DIR=str(tmp_path))
    try:
        term.expect(r"hetero chat with .*\r\n>>> ")
        term.send("/bye\r")
        assert term.wait() == 0
    finally:
        term.close()


def test_loading_shows_its_phases_on_a_terminal(tmp_path):
    term = Terminal(["generate", "-m", str(GGUF), "-p", "Hi", "-n", "2", "-c", "64"], HETERO_CACHE_DIR=str(tmp_path))
    try:
        term.expect(r"loading qwen3-q8_0\.gguf \.\.\.")
        term.expect(r"building qwen3 \[#+\] 100%")  # the graph, layer by layer
        term.expect(r"preparing kernels \(repacking weights, building device programs\) \.\.\.")  # after the bar
        term.expect(r"processing the prompt \.\.\.")
        term.expect(STATS)
        assert term.wait() == 0
    finally:
        term.close()


def test_a_gguf_file_without_sampling_keys_samples_as_llama_cpp_does():
    result = run_cli(["generate", "-m", str(GGUF), "-p", "Hi", "-n", "2", "-c", "64"])
    assert result.returncode == 0, result.stderr
    assert result.stderr.rstrip().endswith("| sampling temp 0.8 top-k 40 top-p 0.95 min-p 0.05 (llama.cpp defaults)]")
    folder = run_cli(["generate", "-m", MODEL, "-p", "Hi", "-n", "2"])
    assert folder.stderr.rstrip().endswith("| sampling greedy: generation_config.json does not sample]")
