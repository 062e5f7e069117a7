from hetero.testing import conformance


def test_toy_passes_the_conformance_kit():
    conformance.run(backend="toy")
