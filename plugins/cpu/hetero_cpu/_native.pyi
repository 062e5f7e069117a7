# The pybind11 module built from plugins/cpu/src (C++): type checkers see that it exists, not its signatures (no
# stubs are generated from the C++; every attribute is Any).
from typing import Any

def __getattr__(name: str) -> Any: ...
