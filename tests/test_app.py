"""``memsim app``: the command it runs, the page it serves, the Dockerfile that runs it (the page itself is driven
in Chromium by tests/browser/test_app_page.py)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

import memsim_widget.app as app
from memsim_widget.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def test_the_page_binds_loopback_by_default_and_hides_code_and_tracebacks() -> None:
    argv = app.command()
    assert argv[1:4] == ["-m", "voila", str(app.PAGE)]
    assert "--Voila.ip=127.0.0.1" in argv
    assert {"--strip_sources=True", "--show_tracebacks=False", "--no-browser", "--template=memsim"} <= set(
        argv
    )
    assert f"--port={app.DEFAULT_PORT}" in argv


def test_the_page_is_one_code_cell_showing_the_widget() -> None:
    nb = json.loads(app.PAGE.read_text(encoding="utf-8"))
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert code == ["from memsim_widget import MemSim\n\nMemSim()"]


def test_the_template_extends_voilas_lab_template_and_its_folder_is_first_on_the_jupyter_path() -> None:
    folder = app.JUPYTER_DATA / "voila" / "templates" / "memsim"
    assert json.loads((folder / "conf.json").read_text()) == {"base_template": "lab"}
    assert "extends 'lab/index.html.j2'" in (folder / "index.html.j2").read_text()
    assert app.environment()["JUPYTER_PATH"].split(":")[0] == str(app.JUPYTER_DATA)


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_a_bad_port_is_one_line_and_exit_2(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["app", "--port", port])
    except SystemExit as exc:  # argparse's own one-line error
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "port" in err


def test_without_voila_the_cli_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(app.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(app.os, "execve", lambda *a: pytest.fail("must not start a server"))
    assert main(["app"]) == 2
    assert (
        capsys.readouterr().err
        == 'memsim: error: app: the page needs Voila: pip install "memsim-widget[app]"\n'
    )


def test_the_dockerfile_runs_memsim_app_on_the_space_port_and_installs_the_app_extra() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))  # type: ignore[union-attr]
    assert cmd[0] == "memsim"
    args = build_parser().parse_args(cmd[1:])
    assert (args.command, args.port, args.host) == ("app", 7860, "0.0.0.0")
    assert re.search(r"^EXPOSE 7860$", text, re.M)
    installs = [shlex.split(m) for m in re.findall(r"^RUN pip install (.*)$", text, re.M)]
    assert any(".[widget,app]" in words for words in installs)
    # Every file the image copies exists here (a renamed file would break the build).
    for line in re.findall(r"^COPY --chown=user (.*) \S+$", text, re.M):
        for name in line.split():
            assert (ROOT / name).exists(), name
