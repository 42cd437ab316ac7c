// "Open a config": a file picker whose files are read as text and sent as {type: "import_config", files:
// [{name, text}]}; Python reads them (memsim_widget.importers), shows the scenario, and answers in the
// `config_import` trait: the files, the memory settings they did not give (one line each) or the error.
// "Measure on this GPU" (in the Verify panel): shown only when Python says a CUDA GPU is likely (`measure`
// trait); a click sends {type: "measure"} and the trait carries the measured-vs-predicted text.

import { h } from "./dom.js";

const ACCEPT = ".yaml,.yml,.json,.toml,.py,.sh";

/** The "open a config" control: a file input (several files: a config and its DeepSpeed JSON), a status line
 * and the list of settings the files did not give. */
export function createImportPanel(doc) {
  const input = h(doc, "input", { type: "file", multiple: "", accept: ACCEPT, class: "memsim-import-files",
    "aria-label": "your launch config files (axolotl, LLaMA-Factory, torchtune, torchtitan, accelerate, DeepSpeed, TrainingArguments)" });
  const status = h(doc, "div", { class: "memsim-import-status", role: "status" });
  const unread = h(doc, "ul", { class: "memsim-import-unread" });
  const root = h(doc, "details", { class: "memsim-details-import" }, [
    h(doc, "summary", { text: "open a config" }), input, status, unread,
  ]);
  return { root, input, status, unread };
}

/** Show the `config_import` trait: the error, or the files read and their unread settings. */
export function renderImport(doc, panel, state = {}) {
  const files = state.files ?? [];
  const lines = state.unread ?? [];
  panel.status.textContent = state.error
    ? state.error
    : files.length ? `read ${files.join(", ")}: ${lines.length} setting(s) not in the files, memsim's assumption shown` : "";
  panel.status.classList.toggle("memsim-import-error", Boolean(state.error));
  panel.unread.replaceChildren(...lines.map((line) => h(doc, "li", { text: line })));
}

/** The files of an input as [{name, text}] (File.text(), in order). */
export async function readFiles(fileList) {
  return Promise.all([...(fileList ?? [])].map(async (f) => ({ name: f.name, text: await f.text() })));
}

/** Wire the control: picking files sends them to Python; `config_import` redraws it. Returns `show`. */
export function wireImport(ctx, panel) {
  const { doc, model } = ctx;
  const show = () => renderImport(doc, panel, model.get("config_import") ?? {});
  ctx.listen(panel.input, "change", async () => {
    const files = await readFiles(panel.input.files);
    if (files.length) model.send({ type: "import_config", files, format: "auto" });
  });
  ctx.onModel("config_import", show);
  return show;
}

/** "Measure on this GPU": a button and the result text, hidden unless `measure.available`. */
export function createMeasurePanel(doc) {
  const button = h(doc, "button", { type: "button", class: "memsim-measure", text: "Measure on this GPU",
    title: "Run three real training steps of this scenario on this machine's GPU (random weights) and compare" });
  const status = h(doc, "span", { class: "memsim-measure-status", role: "status" });
  const text = h(doc, "pre", { class: "memsim-measure-text", hidden: "" });
  const root = h(doc, "div", { class: "memsim-measure-panel", hidden: "" }, [button, status, text]);
  return { root, button, status, text };
}

/** Show the `measure` trait. */
export function renderMeasure(panel, state = {}) {
  panel.root.hidden = !state.available;
  const running = state.state === "running";
  panel.button.disabled = running;
  panel.status.textContent = running ? "measuring (three real steps)…" : state.error ?? "";
  panel.text.hidden = !state.text;
  panel.text.textContent = state.text ?? "";
}

/** Wire the measure button; `measure` redraws it. Returns `show`. */
export function wireMeasure(ctx, panel) {
  const { model } = ctx;
  const show = () => renderMeasure(panel, model.get("measure") ?? {});
  ctx.listen(panel.button, "click", () => {
    if (!panel.button.disabled) model.send({ type: "measure" });
  });
  ctx.onModel("measure", show);
  return show;
}
