"""Handlers for tests/test_vendor_worker.py, run by the worker's own Python (standard library and numpy only)."""

import os
import signal
import time

import numpy as np

_state: dict[str, np.ndarray] = {}  # kept between calls: the worker is one long-lived process


def remember(name: str, array: np.ndarray) -> dict:
    _state[name] = array
    return {"shape": list(array.shape), "dtype": str(array.dtype)}


def scaled(name: str, factor: float) -> dict:
    print("a toolkit printing to stdout must not corrupt the frames")
    return {"value": _state[name] * factor, "pid": os.getpid()}


def fail(message: str) -> None:
    raise ValueError(message)


def abort() -> None:
    print("converter: fatal error in the graph optimizer", flush=True)
    os.kill(os.getpid(), signal.SIGABRT)


def sleep(seconds: float) -> None:
    time.sleep(seconds)
