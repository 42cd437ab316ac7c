"""The widget's "launch config" export: the files of ``memsim_widget.export`` for the current scenario.

The front end sends ``{"type": "export", "format": F}``; Python writes the files (or the refusal naming the
field) into the ``export`` trait with a new ``id``, and the browser downloads each file as a Blob.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memsim_widget.errors import ScenarioError

if TYPE_CHECKING:
    from memsim_widget.widget.host import WidgetHost


def export_formats() -> list[str]:
    """The formats the dropdown offers (``memsim_widget.export.FORMATS``)."""
    from memsim_widget.export import FORMATS

    return list(FORMATS)


class ExportController:
    """The launch-config export of a widget (its ``WidgetHost``): answers the ``export`` message.

    ``MemSim.export_config`` delegates here.
    """

    def __init__(self, host: WidgetHost) -> None:
        """The export panel of a new widget (it keeps no state but the ``export`` trait)."""
        self.host = host

    @staticmethod
    def initial() -> dict[str, Any]:
        """The ``export`` trait of a new widget: the formats, no files yet."""
        return {"formats": export_formats(), "id": 0, "format": "", "files": {}, "error": ""}

    def files(self, fmt: str) -> dict[str, str]:
        """``MemSim.export_config``: the current scenario's launch-config files in one format."""
        from memsim_widget.export import export

        return export(self.host.scenario, fmt, self.host.estimate)

    def export_msg(self, content: Mapping[str, Any]) -> None:
        """Answer an export request: the files, or the error that names the field (never raised)."""
        fmt = content.get("format")
        try:
            files, error = self.files(str(fmt)), ""
        except ScenarioError as exc:
            files, error = {}, str(exc)
        host = self.host
        with host._lock:
            state = host._trait("export")
            host._publish(
                "export", {**state, "id": state["id"] + 1, "format": fmt, "files": files, "error": error}
            )
