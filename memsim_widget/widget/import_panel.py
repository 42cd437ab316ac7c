"""The widget's "open a config" control and the Verify panel's "Measure on this GPU".

Open a config: the front end sends ``{"type": "import_config", "files": [{"name", "text"}], "format"}`` (the
files the user picked, read as text in the browser); Python reads them with ``memsim_widget.importers`` in a
temporary folder, applies the scenario like an edit, and publishes the ``config_import`` trait: ``id`` (one more
per answer), ``files``, ``unread`` (every memory setting the files did not give, with memsim's assumption) and
``error`` (one line naming the file and key). An uploaded model config.json is kept inline in the scenario.

Measure: offered only where a CUDA GPU is likely (a driver device node or nvidia-smi; torch is not imported to
decide); ``{"type": "measure"}`` runs ``memsim_widget.measure`` on the current scenario in a background thread
and publishes the ``measure`` trait: ``available``, ``state`` (idle, running, done, error), ``text`` (measured
next to predicted) and ``error``. Untested on a GPU in this repository's CI.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memsim_widget.errors import ScenarioError

if TYPE_CHECKING:
    from memsim_widget.importers import Imported
    from memsim_widget.widget.host import WidgetHost

#: At most this many files per upload, each at most this many characters (launch configs are kilobytes).
MAX_FILES = 8
MAX_CHARS = 2**20


def _uploads(content: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The uploaded (name, text) pairs, checked: a plain file name each, text, within the limits."""
    files = content.get("files")
    if not isinstance(files, list) or not files:
        raise ScenarioError("files", "pick one or more launch config files")
    if len(files) > MAX_FILES:
        raise ScenarioError("files", f"at most {MAX_FILES} files, got {len(files)}")
    out = []
    for f in files:
        name = f.get("name") if isinstance(f, Mapping) else None
        text = f.get("text") if isinstance(f, Mapping) else None
        if not isinstance(name, str) or not isinstance(text, str):
            raise ScenarioError("files", "each file must be {name, text}")
        base = Path(name.replace("\\", "/")).name
        if base in ("", ".", "..") or len(base) > 200:
            raise ScenarioError("files", f"{name[:60]!r} is not a file name")
        if len(text) > MAX_CHARS:
            raise ScenarioError(base, f"is larger than {MAX_CHARS // 2**20} MiB: not a launch config")
        out.append((base, text))
    return out


class ImportController:
    """Reads the user's launch configs into the widget (``MemSim.import_config`` and the upload message)."""

    def __init__(self, host: WidgetHost) -> None:
        self.host = host

    @staticmethod
    def initial() -> dict[str, Any]:
        return {"id": 0, "files": [], "unread": [], "error": ""}

    def apply(self, paths: Sequence[str | Path], fmt: str = "auto") -> Imported:
        """Read ``paths`` as one job's launch configs and show the scenario; raises ScenarioError when bad."""
        from memsim_widget.catalog.models import resolve_model_config
        from memsim_widget.importers import import_config

        gpu = self.host.scenario.to_dict()["gpu"]  # no launch config names the card: keep the one shown
        imported = import_config(list(paths), fmt, {"gpu": gpu}, given_by="the widget's GPU")
        data = imported.scenario.to_dict()
        model = data.get("model")
        folders = {str(Path(p).resolve().parent) for p in paths}
        if (
            isinstance(model, str)
            and str(Path(model).resolve().parent) in folders
            and model.endswith(".json")
        ):
            data["model"] = resolve_model_config(model)  # a config.json given with the files: kept inline
        exc = self.host._submit(data, relative=False)
        if exc is not None:
            raise exc
        self._publish([Path(p).name for p in paths], imported.unread, "")
        return imported

    def import_msg(self, content: Mapping[str, Any]) -> None:
        """Answer an upload: the scenario applied and its unread settings, or the error (never raised)."""
        names: list[str] = []
        try:
            uploads = _uploads(content)
            names = [n for n, _ in uploads]
            fmt = content.get("format") or "auto"
            with tempfile.TemporaryDirectory(prefix="memsim-import-") as folder:
                paths = []
                for name, text in uploads:
                    path = Path(folder) / name
                    path.write_text(text, encoding="utf-8")
                    paths.append(path)
                self.apply(paths, str(fmt))
        except ScenarioError as exc:
            self._publish(names, [], " ".join(str(exc).splitlines()))

    def _publish(self, files: list[str], unread: list[str], error: str) -> None:
        host = self.host
        with host._lock:
            state = host._trait("config_import")
            host._publish("config_import", {"id": state.get("id", 0) + 1, "files": files, "unread": unread,
                                            "error": error})  # fmt: skip


def cuda_likely() -> bool:
    """A CUDA GPU is likely here: torch is installed and an NVIDIA driver answers (its device node or
    nvidia-smi). Cheap: torch is not imported; the measurement itself checks ``torch.cuda.is_available()``."""
    if importlib.util.find_spec("torch") is None:
        return False
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


class MeasureController:
    """ "Measure on this GPU" in the Verify panel: three real steps of the current scenario on the local GPU."""

    def __init__(self, host: WidgetHost) -> None:
        self.host = host
        self._thread: threading.Thread | None = None

    @staticmethod
    def initial(available: bool | None = None) -> dict[str, Any]:
        return {"available": cuda_likely() if available is None else available, "state": "idle", "text": "",
                "error": ""}  # fmt: skip

    def measure_msg(self, content: Mapping[str, Any]) -> None:
        """Start a measurement of the current scenario (one at a time; refused where no GPU is offered)."""
        host = self.host
        with host._lock:
            state = host._trait("measure")
            if not state.get("available"):
                host._publish("measure", {**state, "state": "error", "error": "no CUDA GPU here"})
                return
            if self._thread is not None and self._thread.is_alive():
                return
            scenario = host.scenario
            host._publish("measure", {**state, "state": "running", "text": "", "error": ""})
        self._thread = threading.Thread(
            target=self._run, args=(scenario,), name="memsim-measure", daemon=True
        )
        self._thread.start()

    def _run(self, scenario: Any) -> None:
        from memsim_widget import measure

        text, error = "", ""
        try:
            reason = measure.require_cuda()
            if reason:
                raise ScenarioError("measure", reason)
            measure.check_measurable(scenario)
            sc = measure.local_gpu(scenario)
            text = measure.report(sc, measure.run(sc), measure.environment())
        except ScenarioError as exc:
            error = str(exc)
        except Exception as exc:  # a real run's failure (out of memory...) is shown, not raised in a thread
            error = f"{type(exc).__name__}: {exc}"
        host = self.host
        with host._lock:
            if not host._closed:
                state = host._trait("measure")
                host._publish("measure", {**state, "state": "error" if error else "done", "text": text,
                                          "error": error})  # fmt: skip
