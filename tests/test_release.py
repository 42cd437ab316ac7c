"""Release hygiene: the license pyproject declares is the one in LICENSE, the version is written once (in
``memsim_widget/version.py``, read by hatch for the wheel) and the changelog has a section for it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from memsim_widget.version import __version__

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_file_is_the_declared_apache_2() -> None:
    assert PYPROJECT["project"]["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a pointer to it


def test_version_is_written_once() -> None:
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "memsim_widget/version.py"


def test_hatch_reads_the_package_version() -> None:
    """The wheel's metadata version is the package's ``__version__`` (hatchling's own metadata reader)."""
    core = pytest.importorskip("hatchling.metadata.core")
    manager = pytest.importorskip("hatchling.plugin.manager")
    assert core.ProjectMetadata(str(ROOT), manager.PluginManager()).version == __version__


def test_changelog_has_the_version() -> None:
    assert f"## {__version__}" in (ROOT / "CHANGELOG.md").read_text()
