"""Testing helpers for hetero and for backend authors.

* ``hetero.testing.conformance`` — the conformance kit: ``conformance.run(backend="name")`` in a test, or
  ``python -m hetero.testing --backend name`` from a shell;
* ``hetero.testing.pytest_plugin`` — ``--hetero-backend NAME`` and the ``conformance_check`` fixture, one test per
  check (pytest loads it through hetero's ``pytest11`` entry point: no conftest.py line);
* ``hetero.testing.dist`` — ``make_distribution``: throwaway installed distributions for plugin tests;
* ``hetero.testing.cases`` — the op case table behind the kit;
* ``hetero.testing.fuzz`` — ``ChildRunner``: fuzz cases in a child process (a crash, hang or memory bomb is a
  finding); ``hetero.testing.onnx_fuzz`` — ONNX graph mutation and its child-process target.

Nothing here is imported by ``import hetero``.
"""
