"""The widget's "launch config" export: the files of ``memsim_widget.export`` for the current scenario.

The front end sends ``{"type": "export", "format": F}``; Python writes the files (or the refusal naming the
field) into the ``export`` trait with a new ``id``, and the browser downloads each file as a Blob.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import traitlets

from memsim_widget.errors import ScenarioError

if TYPE_CHECKING:
    from memsim_widget.widget.memsim import MemSim


def export_formats() -> list[str]:
    """The formats the dropdown offers (``memsim_widget.export.FORMATS``)."""
    from memsim_widget.export import FORMATS

    return list(FORMATS)


class ExportPanel(traitlets.HasTraits):
    """``MemSim``'s launch-config export: the ``export`` trait, its message, and ``export_config``."""

    #: ``formats`` (the dropdown), ``id`` (one more per request answered), ``format``, ``files`` (file name ->
    #: text of the last export), ``error`` (the refusal naming the field, '' when the files were written).
    export = traitlets.Dict().tag(sync=True)

    @traitlets.default("export")
    def _export_default(self) -> dict[str, Any]:
        return {"formats": export_formats(), "id": 0, "format": "", "files": {}, "error": ""}

    def export_config(self: MemSim, fmt: str) -> dict[str, str]:
        """The launch-config files of the current scenario in one format: ``{file name: text}``."""
        from memsim_widget.export import export

        return export(self._scenario, fmt, self._estimate)

    def _export_msg(self: MemSim, content: Mapping[str, Any]) -> None:
        """Answer an export request: the files, or the error that names the field (never raised)."""
        fmt = content.get("format")
        try:
            files, error = self.export_config(str(fmt)), ""
        except ScenarioError as exc:
            files, error = {}, str(exc)
        with self._lock:
            self.export = {
                **self.export,
                "id": self.export["id"] + 1,
                "format": fmt,
                "files": files,
                "error": error,
            }
