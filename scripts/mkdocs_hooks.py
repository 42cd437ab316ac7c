"""MkDocs hooks (mkdocs.yml ``hooks:``): links from a docs page to a repository file outside ``docs/``.

On GitHub such a link (``[gpus.json](../memsim_widget/catalog/gpus.json)``) opens the file; in the site the file is
not there, and the strict build would refuse the link. Here each one is checked: a target that does not exist in
the repository fails the build (a broken link, as for pages), and one that exists is written as the path in code
(the text kept), so the site says where to look without a dead link.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

#: A Markdown inline link whose target is relative and climbs out of the page's folder: [text](../path#anchor).
_OUTSIDE = re.compile(r"\[([^\]]+)\]\(((?:\.\./)+[^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Check and rewrite the page's links to repository files outside the docs folder."""
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
