"""Running a test's work in several threads at once (shared by the thread-safety tests)."""

from __future__ import annotations

import threading


def run_in_threads(work, count: int) -> list:
    """``work(i)`` in ``count`` threads started together; their results in order, or the first exception raised."""
    results: list = [None] * count
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def body(i: int) -> None:
        try:
            start.wait()
            results[i] = work(i)
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    if errors:
        raise errors[0]
    return results
