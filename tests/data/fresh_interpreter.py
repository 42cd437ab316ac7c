"""Run a snippet in a fresh Python interpreter and read the JSON object it prints last.

Compiled traces run one per interpreter, which keeps Dynamo's and Inductor's process-wide state out of the test
process. An order dependence seen earlier (after eager traces and another compiled one in the same process, a
compiled trace came out 4.5 MB higher) was not reproduced on 2026-12-06, but one of its kind was found: Dynamo's
garbage holds the first step's output until a full collection, whose timing depended on what the process had run
(docs/trace.md, "Garbage collection"); a trace now runs no automatic collection
(``memsim_widget.trace.tracker.YOUNG_GENERATIONS``). The snippet sees the repository and ``tests/data``
(``fidelity_cases``) on its path.
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
