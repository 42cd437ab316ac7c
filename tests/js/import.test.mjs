import assert from "node:assert/strict";
import { test } from "node:test";

import { createImportPanel, createMeasurePanel, readFiles, renderImport, renderMeasure } from "../../js/src/import.js";
import { render } from "../../js/src/index.js";
import { fakeModel, fire, fixtureState, makeDom } from "./fake-model.mjs";

test("readFiles reads every picked file as text, in order", async () => {
  const files = [new File(["base_model: x\n"], "ax.yaml"), new File(["{}"], "ds_config.json")];
  assert.deepEqual(await readFiles(files), [{ name: "ax.yaml", text: "base_model: x\n" }, { name: "ds_config.json", text: "{}" }]);
});

test("the control lists the settings the files did not give, or shows the error", () => {
  const { doc } = makeDom();
  const panel = createImportPanel(doc);
  renderImport(doc, panel, { id: 1, files: ["ax.yaml"], unread: ["gpu (every file): ...", "parallel.dp (ax.yaml): ..."], error: "" });
  assert.match(panel.status.textContent, /read ax\.yaml: 2 setting/);
  assert.deepEqual([...panel.unread.children].map((li) => li.textContent.split(" ")[0]), ["gpu", "parallel.dp"]);
  renderImport(doc, panel, { id: 2, files: ["ax.yaml"], unread: [], error: "ax.yaml: micro_batch_size: must be an integer >= 1" });
  assert.ok(panel.status.classList.contains("memsim-import-error"));
  assert.equal(panel.unread.children.length, 0);
});

test("picking files sends them to Python as {type: import_config, files}", async () => {
  const { el, window } = makeDom();
  const model = fakeModel({ ...fixtureState(), config_import: { id: 0, files: [], unread: [], error: "" } });
  const cleanup = render({ model, el });
  const input = el.querySelector(".memsim-import-files");
  Object.defineProperty(input, "files", { value: [new File(["stage: sft\n"], "lf.yaml")] });
  fire(window, input, "change");
  await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(model.sent.at(-1), { type: "import_config", files: [{ name: "lf.yaml", text: "stage: sft\n" }], format: "auto" });
  cleanup();
});

test("Measure on this GPU is in the Verify panel, hidden unless Python offers it", () => {
  const { el, window } = makeDom();
  const model = fakeModel({ ...fixtureState(), measure: { available: false, state: "idle", text: "", error: "" } });
  const cleanup = render({ model, el });
  const panel = el.querySelector(".memsim-trace .memsim-measure-panel");
  assert.ok(panel);
  assert.equal(panel.hidden, true);
  model.set("measure", { available: true, state: "idle", text: "", error: "" });
  assert.equal(panel.hidden, false);
  fire(window, el.querySelector(".memsim-measure"), "click");
  assert.deepEqual(model.sent.at(-1), { type: "measure" });
  cleanup();
});

test("a measurement shows running, then its text", () => {
  const { doc } = makeDom();
  const panel = createMeasurePanel(doc);
  renderMeasure(panel, { available: true, state: "running" });
  assert.equal(panel.button.disabled, true);
  assert.match(panel.status.textContent, /measuring/);
  renderMeasure(panel, { available: true, state: "done", text: "counter  measured  predicted  error" });
  assert.equal(panel.text.hidden, false);
  assert.match(panel.text.textContent, /measured/);
});
