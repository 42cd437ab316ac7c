"""A real JupyterLab server and a headless Debian Chromium, for the browser test and the round-trip benchmark.

Everything stays on 127.0.0.1: the server gets its own token, runtime, data, settings and workspace folders
(so nothing from the user's Jupyter setup leaks in), the news and update checks are off, and the page records
every request so a test can assert that none left the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: JupyterLab settings that keep the page quiet and offline: no news toast, no update check.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}
LOCAL_PREFIXES = ("http://127.0.0.1:", "ws://127.0.0.1:", "data:", "blob:", "about:")

#: The notebook panel the page works on (set by ``open_notebook``).
_PANEL = "window.__memsimPanel"
KERNEL_READY_JS = f"""() => {{
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  if (!k || k.connectionStatus !== 'connected' || k.status !== 'idle') return false;
  {_PANEL} = w;
  return true;
}}"""
#: True once every code cell ran and the kernel is idle again.
ALL_RAN_JS = f"""() => {{
  const p = {_PANEL};
  const k = p.sessionContext.session.kernel;
  const cells = p.content.widgets.filter((c) => c.model.type === 'code');
  return k.status === 'idle' && cells.length > 0 && cells.every((c) => c.model.executionCount !== null);
}}"""
#: Error outputs of the notebook's cells: [{cell, ename, evalue}].
CELL_ERRORS_JS = f"""() => {{
  const out = [];
  {_PANEL}.content.widgets.forEach((c, i) => {{
    if (c.model.type !== 'code') return;
    for (const o of c.model.outputs.toJSON()) {{
      if (o.output_type === 'error') out.push({{cell: i, ename: o.ename, evalue: o.evalue}});
    }}
  }});
  return out;
}}"""
#: Run code in the notebook's kernel (not in a cell) and return what it printed.
KERNEL_EXEC_JS = f"""async (code) => {{
  const kernel = {_PANEL}.sessionContext.session.kernel;
  const future = kernel.requestExecute({{code, store_history: false}});
  let out = '';
  future.onIOPub = (msg) => {{
    const t = msg.header.msg_type;
    if (t === 'stream') out += msg.content.text;
    if (t === 'error') out += `ERROR ${{msg.content.ename}}: ${{msg.content.evalue}}`;
  }};
  await future.done;
  return out;
}}"""


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium_available() -> str | None:
    """Why the browser checks cannot run here, or None when they can."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is missing (scripts/dev test installs Debian's chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is not installed"
    if shutil.which("jupyter", path=str(Path(sys.executable).parent)) is None:
        try:
            import jupyterlab  # noqa: F401
        except ImportError:
            return "jupyterlab is not installed"
    return None


class Lab:
    """A JupyterLab server on 127.0.0.1 serving a temporary folder."""

    def __init__(self, root: Path, port: int, token: str, proc: subprocess.Popen, log: Path) -> None:
        self.root, self.port, self.token, self.proc, self.log = root, port, token, proc, log

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, notebook: str) -> str:
        """The page of a notebook in the served folder."""
        return f"{self.base}/lab/tree/{notebook}?token={self.token}"

    def api(self, path: str) -> Any:
        """GET a server REST endpoint (JSON)."""
        req = urllib.request.Request(f"{self.base}{path}", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    def log_tail(self, n: int = 40) -> str:
        """The last lines of the server log (for failure messages)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def wait_for_status(base: str, token: str, proc: subprocess.Popen | None, timeout: float = 90) -> None:
    """Poll ``/api/status`` until the server answers (raises on timeout or if the server exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with status {proc.returncode}")
        try:
            req = urllib.request.Request(f"{base}/api/status", headers={"Authorization": f"token {token}"})
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{base}/api/status did not answer within {timeout:.0f} s")


def wait_http_ok(url: str, proc: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    """Poll ``url`` until it answers 200; raise with the server log's text if the server exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"the server exited with status {proc.returncode}:\n{log.read_text(errors='replace')}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s:\n{log.read_text(errors='replace')}")


def stop(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Stop a process started in its own session: SIGTERM to its group (server and kernels), then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@contextmanager
def jupyter_lab(notebooks: dict[str, str | Path], *, keep: Path | None = None) -> Iterator[Lab]:
    """Serve fresh copies of notebooks (``{served name: source path or JSON text}``) from a temporary folder.

    The server runs with the current Python (``sys.executable -m jupyter lab``), so the kernel sees the same
    environment, ``--allow-root`` (as root it would exit), ``JUPYTER_PLATFORM_DIRS=1`` and private Jupyter
    folders. It is stopped, with its kernels, on exit; its log is copied to ``keep`` if given.
    """
    tmp = Path(tempfile.mkdtemp(prefix="memsim-lab-"))
    root = tmp / "root"
    root.mkdir()
    for name, src in notebooks.items():
        if isinstance(src, Path):
            shutil.copyfile(src, root / name)
        else:
            (root / name).write_text(src, encoding="utf-8")
    settings = tmp / "settings"
    for rel, value in LAB_SETTINGS.items():
        path = settings / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value), encoding="utf-8")
    env = {
        **os.environ,
        "JUPYTER_PLATFORM_DIRS": "1",
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
        "PYTHONUNBUFFERED": "1",
    }
    port, token = free_port(), os.urandom(12).hex()
    log = tmp / "lab.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    lab = Lab(root, port, token, proc, log)
    try:
        try:
            wait_for_status(lab.base, token, proc)
        except Exception as exc:
            raise RuntimeError(f"{exc}\n--- jupyter lab log ---\n{lab.log_tail()}") from exc
        yield lab
    finally:
        stop(proc)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log, keep / "jupyterlab.log")
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def chromium_page(viewport: tuple[int, int] = (1400, 1000)) -> Iterator[tuple[Any, list[str], list[str]]]:
    """A headless Chromium page; yields ``(page, outside, page_errors)``.

    ``outside`` collects the URL of every request (HTTP or WebSocket) that is not for 127.0.0.1, ``data:`` or
    ``blob:``; ``page_errors`` the uncaught exceptions of the page.
    """
    from playwright.sync_api import sync_playwright

    outside: list[str] = []
    page_errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
            context.on(
                "request", lambda r: None if r.url.startswith(LOCAL_PREFIXES) else outside.append(r.url)
            )
            page = context.new_page()
            page.on(
                "websocket", lambda ws: None if ws.url.startswith(LOCAL_PREFIXES) else outside.append(ws.url)
            )
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            yield page, outside, page_errors
        finally:
            browser.close()


def open_notebook(page: Any, lab: Lab, name: str, timeout_ms: int = 120_000) -> None:
    """Open a notebook and wait until its kernel is connected and idle (the toolbar's 'idle' comes earlier)."""
    page.goto(lab.url(name))
    page.wait_for_function(KERNEL_READY_JS, timeout=timeout_ms, polling=200)


def run_all_cells(page: Any, timeout_ms: int = 120_000) -> list[dict[str, Any]]:
    """Run every cell with the app's command, wait for the kernel to finish; returns the cells' errors."""
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(ALL_RAN_JS, timeout=timeout_ms, polling=200)
    return page.evaluate(CELL_ERRORS_JS)


def kernel_exec(page: Any, code: str) -> str:
    """Run ``code`` in the notebook's kernel (not in a cell) and return its printed output."""
    return page.evaluate(KERNEL_EXEC_JS, code)


def kernel_json(page: Any, expr: str, setup: str = "") -> Any:
    """The value of a Python expression in the kernel (after running ``setup``), through JSON."""
    text = kernel_exec(page, f"{setup}\nimport json as _json\nprint(_json.dumps({expr}))")
    if text.startswith("ERROR"):
        raise RuntimeError(f"{expr}: {text}")
    return json.loads(text)
