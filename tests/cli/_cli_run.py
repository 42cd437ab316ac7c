"""Run ``memsim`` in the test's own process (shared by the CLI test modules)."""

from __future__ import annotations

import io
import sys

import pytest

from memsim_widget.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    """``memsim argv`` in this process: exit status, stdout, stderr (argparse's exit counts as status)."""
    old = sys.stdin
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.stdin = old
    out, err = capsys.readouterr()
    return code, out, err
