"""The widget's front-end files: its ES module and CSS (``js/``, packaged as ``memsim_widget/static/``) and the
vega-embed bundle the charts draw with.

``js/widget.js`` is the esbuild bundle of ``js/src/*.js`` (``scripts/dev build-js``), committed so that the wheel
and an install from git need no node; a node test checks that it matches the sources.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

#: Vega-Lite version of the bundled vega-embed (matches ``charts.SCHEMA``).
VL_CONVERT_VERSION = "v6_4"


def asset(name: str) -> Path:
    """A front-end file: the packaged copy (wheel) first, else the repository's ``js/`` (editable install)."""
    packaged = Path(__file__).parent.parent / "static" / name
    if packaged.exists():
        return packaged
    return Path(__file__).resolve().parents[2] / "js" / name


@functools.cache
def vega_bundle() -> str:
    """vega-embed + vega + vega-lite as one ES module exporting ``vegaEmbed`` ('' without vl-convert).

    Bundling takes a few seconds, so the result is cached on disk (``$MEMSIM_CACHE_DIR`` or
    ``~/.cache/memsim-widget``) per vl-convert version.
    """
    try:
        import vl_convert as vlc
    except ImportError:
        return ""
    root = os.environ.get("MEMSIM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "memsim-widget"
    )
    # vl_convert's stub (__init__.pyi) leaves out the __version__ the module has
    version = vlc.__version__  # pyright: ignore[reportAttributeAccessIssue]
    path = Path(root) / f"vega-embed-{version}-{VL_CONVERT_VERSION}.js"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        pass
    try:
        src = vlc.javascript_bundle("export { vegaEmbed };\n", vl_version=VL_CONVERT_VERSION)
    except Exception:  # an older vl-convert without this Vega-Lite version: its default one
        src = vlc.javascript_bundle("export { vegaEmbed };\n")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src, encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass
    return src
