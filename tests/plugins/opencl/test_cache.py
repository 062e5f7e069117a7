"""Programs are cached on disk per device and driver (keyed by source + options + device), tuning results too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .conftest import needs_device

pytestmark = needs_device

SCRIPT = """
import json, numpy as np
from hetero.llm.synthetic import load_synthetic
llm = load_synthetic("tiny", "q4", backends=["opencl"], on_fallback="error", context=64, progress=False)
llm.prefill([1, 2, 3])
llm.forward([4])
rt = llm.session.backends[0].rt
print(json.dumps({"stats": rt.stats, "dir": str(rt.cache_dir)}))
"""


def run(cache: Path) -> dict:
    import json

    env = {**os.environ, "HETERO_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_programs_from_the_cache(tmp_path: Path) -> None:
    first = run(tmp_path)
    assert first["stats"]["built"] > 0
    folder = Path(first["dir"])
    assert folder.parent == tmp_path / "opencl"
    assert list(folder.glob("weights-*.bin")) and list(folder.glob("llm-*.bin"))
    assert (folder / "tuning.json").is_file()
    second = run(tmp_path)
    assert second["stats"]["built"] == 0
    assert second["stats"]["loaded"] == first["stats"]["built"]
