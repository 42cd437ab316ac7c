"""The widget as a page without Jupyter: the packaged ``page.ipynb`` served by Voilà.

Why Voilà (not Solara): the page is the very notebook cell users run (``MemSim()``), rendered by the same
JupyterLab 4 widget manager the widget is tested in, with the code cells hidden; nothing is rewritten for a
second UI framework, and Voilà serves its own assets (no CDN). Voilà starts one kernel per visitor, so every
visitor has their own scenario. ``memsim app`` binds 127.0.0.1 unless told otherwise; a container (the
Dockerfile, a Hugging Face Space) passes ``--host 0.0.0.0`` itself.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from memsim_widget.errors import ScenarioError

#: The notebook the page renders (shipped inside the package, so a wheel install serves it too).
PAGE = Path(__file__).with_name("page.ipynb")
#: A Jupyter data folder holding the page's Voila template (``memsim``: the lab template, offline).
JUPYTER_DATA = Path(__file__).with_name("jupyter")
DEFAULT_PORT = 8866
#: A visitor's kernel is shut down after this many idle seconds (a public page must not pile up kernels).
CULL_IDLE_SECONDS = 1800


def voila_available() -> str | None:
    """None when Voilà is installed, else the one line saying how to install it."""
    if importlib.util.find_spec("voila") is None:
        return 'the page needs Voila: pip install "memsim-widget[app]"'
    return None


def command(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, open_browser: bool = False) -> list[str]:
    """The Voilà command line that serves the page (code cells hidden, tracebacks not shown to visitors)."""
    if not 0 < port < 65536:
        raise ScenarioError("port", f"must be 1-65535, got {port}")
    return [
        sys.executable,
        "-m",
        "voila",
        str(PAGE),
        f"--Voila.ip={host}",
        f"--port={port}",
        "--no-browser" if not open_browser else "--Voila.open_browser=True",
        "--strip_sources=True",
        "--show_tracebacks=False",
        "--theme=light",
        "--template=memsim",
        f"--MappingKernelManager.cull_idle_timeout={CULL_IDLE_SECONDS}",
        "--MappingKernelManager.cull_interval=60",
    ]


def environment() -> dict[str, str]:
    """This process's environment with the page's template folder first on ``JUPYTER_PATH``."""
    env = dict(os.environ)
    env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(JUPYTER_DATA), env.get("JUPYTER_PATH", "")) if p)
    return env


def serve(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, open_browser: bool = False) -> int:
    """Replace this process by the Voilà server (Ctrl-C stops it); raise ScenarioError when Voilà is missing."""
    argv = command(host, port, open_browser=open_browser)
    missing = voila_available()
    if missing is not None:
        raise ScenarioError("app", missing)
    os.execve(argv[0], argv, environment())  # our own interpreter with a fixed argument list
    return 0  # pragma: no cover (execv does not return)
