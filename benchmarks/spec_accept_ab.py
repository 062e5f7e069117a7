"""Run benchmarks/spec_loop_cpu.py with the verify path's greedy hint off (argv[1] == "off") or on ("on"); prints the
thread CPU spent in the verify's acceptance (speculative.loop.accept) over the whole run (lm34, issue 20).

    PYTHONPATH=core:plugins/cpu python benchmarks/spec_accept_ab.py off -m MODEL.gguf -r 2 -n 64 --prompt code
"""
import atexit
import runpy
import sys
import time

import hetero.llm.speculative.loop as loop
from hetero.llm.sampler import no_hint

mode = sys.argv.pop(1)
if mode == "off":
    loop.greedy_hint = lambda *a: no_hint
spent = [0, 0, 0]  # ns, calls, rows
accept = loop.accept


def timed(sampler, rows, draft, history, hint=no_hint):
    t = time.thread_time_ns()
    out = accept(sampler, rows, draft, history, hint)
    spent[0] += time.thread_time_ns() - t
    spent[1] += 1
    spent[2] += out[0] + 1
    return out


loop.accept = timed
atexit.register(lambda: print(f"accept {mode}: {spent[0] / 1e6:.2f} ms CPU, {spent[1]} calls, {spent[2]} rows read, "
                              f"{spent[0] / 1e3 / max(spent[2], 1):.1f} us a row"))
sys.argv[0] = "benchmarks/spec_loop_cpu.py"
runpy.run_path("benchmarks/spec_loop_cpu.py", run_name="__main__")
