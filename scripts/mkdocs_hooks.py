"""MkDocs hooks (mkdocs.yml ``hooks:``): the tables written from the code, and links from a docs page to a
repository file outside ``docs/``.

Generated tables: a page holds a marker line (``GENERATED``) where the site shows a table written at build time
from the registries (the GPU records, the scenario schema), so adding a card or an optimizer touches no page.

On GitHub such a link (``[gpus.json](../memsim_widget/catalog/gpus.json)``) opens the file; in the site the file is
not there, and the strict build would refuse the link. Here each one is checked: a target that does not exist in
the repository fails the build (a broken link, as for pages), and one that exists is written as the path in code
(the text kept), so the site says where to look without a dead link.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]


def _gpu_table() -> str:
    """docs/gpus.md's catalog table (scripts/gpu_table.py)."""
    spec = importlib.util.spec_from_file_location("gpu_table", ROOT / "scripts" / "gpu_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.table()


def _scenario_fields() -> str:
    """docs/scenario.md's field table, with the engine loaded (it registers ``paged-adamw``) as the CLI runs."""
    import memsim_widget.engine.frameworks  # noqa: F401
    from memsim_widget.scenario_schema import field_table

    return field_table()


#: A page's marker line -> what the site shows in its place (the repository's own code, imported at build time).
GENERATED: dict[str, Callable[[], str]] = {
    "<!-- generated: gpu table -->": _gpu_table,
    "<!-- generated: scenario fields -->": _scenario_fields,
}


def fill_generated(markdown: str) -> str:
    """``markdown`` with each marker line replaced by the table it names."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # this checkout's package, not another install's
    for marker, render in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown


#: A Markdown inline link whose target is relative and climbs out of the page's folder: [text](../path#anchor).
_OUTSIDE = re.compile(r"\[([^\]]+)\]\(((?:\.\./)+[^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill the page's generated tables; check and rewrite its links to repository files outside docs/."""
    markdown = fill_generated(markdown)
    docs = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).resolve().parent
    here = (docs / page.file.src_path).parent

    def rewrite(m: re.Match[str]) -> str:
        text, target = m.group(1), m.group(2)
        path = (here / target).resolve()
        if path.is_relative_to(docs):
            return m.group(0)  # a page or file of the site: MkDocs checks it
        if not path.is_relative_to(root) or not path.exists():
            raise PluginError(f"{page.file.src_path}: the link {target!r} names no file of the repository")
        rel = path.relative_to(root).as_posix()
        return text if text.strip("`") == rel else f"{text} (`{rel}`)"

    return _OUTSIDE.sub(rewrite, markdown)
