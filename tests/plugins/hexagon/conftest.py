"""hetero-hexagon's tests import the plugin from the checkout when it is not installed (plugins/hexagon)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("hetero_hexagon") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "plugins" / "hexagon"))
