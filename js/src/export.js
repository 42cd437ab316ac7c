// Launch config: a format dropdown and "Export", which sends {type: "export", format}; Python answers in the
// `export` trait (the formats it offers, the files of the last export or its error), and the answer to this
// view's request is downloaded, one file each (memsim_widget.export writes them).

import { download, fillSelect, h } from "./dom.js";

/** The launch-config export: a format dropdown, an "Export" button and a status line (memsim_widget.export). */
export function createExportPanel(doc) {
  const select = h(doc, "select", { class: "memsim-export-format", "aria-label": "launch config format" });
  const button = h(doc, "button", { type: "button", class: "memsim-export-config", text: "Export" });
  const status = h(doc, "span", { class: "memsim-export-status", role: "status" });
  const root = h(doc, "details", { class: "memsim-details-export" }, [
    h(doc, "summary", { text: "launch config" }), select, button, status,
  ]);
  return { root, select, button, status };
}

/** Show the `export` trait: the formats Python offers (the panel hides without any), the files or the error. */
export function renderExport(doc, panel, state = {}) {
  const formats = state.formats ?? [];
  if ([...panel.select.options].map((o) => o.value).join() !== formats.join()) fillSelect(doc, panel.select, formats);
  panel.root.hidden = formats.length === 0;
  const names = Object.keys(state.files ?? {});
  panel.status.textContent = state.error || (names.length ? `downloaded ${names.join(", ")}` : "");
  panel.status.classList.toggle("memsim-export-error", Boolean(state.error));
}

/** One text Blob per exported file, in Python's order. */
export function exportBlobs(files = {}) {
  return Object.entries(files).map(([name, text]) => ({ name, blob: new Blob([text], { type: "text/plain;charset=utf-8" }) }));
}

/** Wire the panel into a view: a click asks Python for the files; the answer to that request is downloaded
 * once. Returns `show`. */
export function wireExport(ctx, panel) {
  const { doc, model } = ctx;
  let asked = null; // the trait's id when the request left: a larger id is its answer
  const show = () => renderExport(doc, panel, model.get("export") ?? {});
  ctx.listen(panel.button, "click", () => {
    asked = model.get("export")?.id ?? 0;
    model.send({ type: "export", format: panel.select.value });
  });
  ctx.onModel("export", () => {
    show();
    const state = model.get("export") ?? {};
    if (asked === null || !(state.id > asked)) return;
    asked = null;
    for (const { name, blob } of exportBlobs(state.files)) {
      const url = URL.createObjectURL(blob);
      download(doc, url, name);
      setTimeout(() => URL.revokeObjectURL(url), 1000);
    }
  });
  return show;
}
