"""Run a snippet in a fresh Python interpreter and read the JSON object it prints last.

Compiled traces run one per interpreter, which keeps Dynamo's and Inductor's process-wide state out of the test
process. An order dependence seen earlier (after eager traces and another compiled one in the same process, a
compiled trace came out 4.5 MB higher) was not reproduced on 2026-12-06, but one of its kind was found: Dynamo's
garbage holds the first step's output until a full collection, whose timing depended on what the process had run
(docs/trace.md, "Garbage collection"); a trace now runs no automatic collection
(``memsim_widget.trace.tracker.YOUNG_GENERATIONS``). The snippet sees the repository and ``tests/data``
(``fidelity_cases``) on its path.

"Fresh" is a fork: each test process keeps one server that has imported torch, transformers, Dynamo, Inductor and
the trace modules (``PRELOAD``: imports only, nothing traced or compiled; then frozen out of the garbage
collector, ``gc.freeze``, so the full collection a trace starts with walks only what the child made) and forks
a child per snippet, so a snippet starts with every module loaded and no state any other snippet made (a new interpreter spent about 3.5 s
importing and 4.5 s more in its first compile's lazy imports before each trace: 12 s a case became 6 s). Where
fork is missing it runs in a new interpreter as before; where the snippet's environment differs from the
server's in a variable the preloaded modules read on import (``IMPORT_TIME_ENV``), a new server starts under it.
A snippet's JSON is also kept for the rest of the test session, shared by the xdist workers (``RESULTS_ENV``,
set by tests/conftest.py): the same snippet with the same arguments and environment is a deterministic trace,
computed once per session.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: What the fork server imports before forking (its children start with these loaded).
PRELOAD = (
    "torch",
    "transformers",
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "memsim_widget.trace.api",
    "fidelity_cases",
    "stream_vs_trace",
)
#: Prefixes of environment variables that torch, transformers or Python read when a module is imported (``CI``:
#: torch 2.13.0's functorch and Inductor configs read it on import, docs/trace.md): a snippet whose environment
#: differs from the server's in one of them gets a new server started under its environment.
IMPORT_TIME_ENV = ("TORCH", "PYTORCH", "PYTHON", "OMP", "MKL", "CUDA", "TRANSFORMERS", "HF_", "LD_", "CI")
#: The directory the session's snippet results are kept in (unset: none kept).
RESULTS_ENV = "MEMSIM_SNIPPET_RESULTS"

#: The server: imports ``PRELOAD``, then per request line (JSON: code, args, env, timeout) forks a child that runs
#: the snippet with its stdout and stderr in files, and answers one JSON line (returncode, stdout, stderr).
_SERVER = r"""
import json, os, signal, sys, tempfile, time, traceback
reply = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # whatever the server itself prints goes to stderr, not into its answers
for name in sys.argv[1:]:
    __import__(name)
import gc
gc.collect()
gc.freeze()  # the preloaded modules: a child's collections (a trace starts with a full one) walk only its own objects
null = os.open(os.devnull, os.O_RDONLY)
for line in sys.stdin:
    req = json.loads(line)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        sys.stdout.flush(); sys.stderr.flush(); reply.flush()
        pid = os.fork()
        if pid == 0:
            rc = 0
            try:
                os.dup2(null, 0)
                for fd, path in ((1, out), (2, err)):
                    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                    os.dup2(f, fd)
                    os.close(f)
                os.environ.clear()
                os.environ.update(req["env"])
                sys.argv = ["-c", *req["args"]]
                exec(compile(req["code"], "<snippet>", "exec"), {"__name__": "__main__"})
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
                rc = 1
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(rc)
        deadline = time.monotonic() + (req["timeout"] or 1e9)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                rc = -9
                break
            time.sleep(0.02)
        with open(out) as o, open(err) as e:
            text, errors = o.read(), e.read()
    reply.write(json.dumps({"returncode": rc, "stdout": text, "stderr": errors}) + "\n")
    reply.flush()
"""

_server: subprocess.Popen[str] | None = None
_server_env: dict[str, str] = {}


def _environment() -> dict[str, str]:
    paths = [str(ROOT), str(ROOT / "tests" / "data"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _start(env: dict[str, str]) -> subprocess.Popen[str]:
    global _server, _server_env
    _stop()
    _server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, *PRELOAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=ROOT, env=env,
    )  # fmt: skip
    _server_env = dict(env)
    return _server


def _stop() -> None:
    global _server
    if _server is not None and _server.poll() is None:
        assert _server.stdin is not None
        _server.stdin.close()  # the server's loop ends at end of input
        _server.wait(timeout=30)
    _server = None


atexit.register(_stop)


def _imported(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` the preloaded modules may read on import (``IMPORT_TIME_ENV``)."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)}


def _forked(code: str, args: tuple[str, ...], env: dict[str, str], timeout: float | None) -> dict[str, Any]:
    """Run the snippet in a child of the fork server (started, or restarted where the variables the modules
    import under changed; the child takes the whole of ``env``); the server's answer."""
    server = _server
    if server is None or server.poll() is not None or _imported(env) != _imported(_server_env):
        server = _start(env)
    assert server.stdin is not None and server.stdout is not None
    req = {"code": code, "args": list(args), "env": env, "timeout": timeout}
    server.stdin.write(json.dumps(req) + "\n")
    server.stdin.flush()
    line = server.stdout.readline()
    if not line:
        raise RuntimeError(f"the fork server exited (status {server.wait()})")
    return json.loads(line)


def _spawned(code: str, args: tuple[str, ...], env: dict[str, str], timeout: float | None) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )
    return {"returncode": out.returncode, "stdout": out.stdout, "stderr": out.stderr}


def run_json(code: str, *args: str, timeout: float | None = 600) -> dict[str, Any]:
    """The JSON object ``code`` prints on its last line, run with ``args`` as ``sys.argv[1:]``; raises
    ``RuntimeError`` with the end of its stderr if it fails. Kept for the session where ``RESULTS_ENV`` names a
    directory (the first worker to ask computes it; another asking meanwhile waits for it)."""
    env = _environment()
    run = _forked if hasattr(os, "fork") else _spawned
    store = os.environ.get(RESULTS_ENV)
    try:
        import fcntl
    except ImportError:  # no file locks (Windows): nothing kept
        store = None
    if not store:
        return _parse(run(code, args, env, timeout))
    kept = sorted((k, v) for k, v in env.items() if not k.startswith("PYTEST_"))  # pytest's differ per worker
    key = hashlib.sha256(json.dumps([code, args, kept]).encode()).hexdigest()
    path = Path(store) / f"{key}.json"
    with open(Path(store) / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return json.loads(path.read_text())
        result = _parse(run(code, args, env, timeout))
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(path)
        return result


def _parse(out: dict[str, Any]) -> dict[str, Any]:
    if out["returncode"] != 0:
        raise RuntimeError(out["stderr"][-2000:])
    return json.loads(out["stdout"].strip().splitlines()[-1])
