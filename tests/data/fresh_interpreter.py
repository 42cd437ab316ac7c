"""Run a snippet in a fresh Python interpreter and read the JSON object it prints last.

Compiled traces run one per interpreter: after eager traces and another compiled one in the same process, a
compiled trace came out 4.5 MB (5-10%) higher, an order dependence not yet explained (not Dynamo's caches, reset
around every compiled trace; not the cyclic garbage collector; not AOTAutograd's cache). Run alone, a trace is the
same on every run. The snippet sees the repository and ``tests/data`` (``fidelity_cases``) on its path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_json(code: str, *args: str, timeout: float | None = 600) -> dict[str, Any]:
    """The JSON object ``code`` prints on its last line, run with ``args`` as ``sys.argv[1:]``; raises
    ``RuntimeError`` with the end of its stderr if it fails."""
    paths = [str(ROOT), str(ROOT / "tests" / "data"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])
