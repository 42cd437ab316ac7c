import assert from "node:assert/strict";
import { test } from "node:test";

import { createExportPanel, exportBlobs, renderExport } from "../../js/src/export.js";
import { render } from "../../js/src/index.js";
import { fakeModel, fire, fixtureState, makeDom } from "./fake-model.mjs";

const OFFER = { formats: ["deepspeed", "hf"], id: 0, format: "", files: {}, error: "" };

function mount(exportState) {
  const { doc, el, window } = makeDom();
  const model = fakeModel({ ...fixtureState(), export: exportState });
  const downloads = [];
  window.HTMLAnchorElement.prototype.click = function click() {
    downloads.push({ name: this.getAttribute("download"), href: this.getAttribute("href") });
  };
  const cleanup = render({ model, el });
  return { doc, window, model, downloads, cleanup, q: (sel) => el.querySelector(sel) };
}

test("exportBlobs makes one text Blob per file, in order, holding the file's text", async () => {
  const blobs = exportBlobs({ "a.json": "{}\n", "a.memsim.txt": "note" });
  assert.deepEqual(blobs.map((b) => b.name), ["a.json", "a.memsim.txt"]);
  assert.equal(await blobs[1].blob.text(), "note");
});

test("the panel offers Python's formats, hides without any, and shows an error as the status", () => {
  const { doc } = makeDom();
  const panel = createExportPanel(doc);
  renderExport(doc, panel, {});
  assert.equal(panel.root.hidden, true);
  renderExport(doc, panel, { ...OFFER, id: 1, error: "method: cannot be exported to torchtitan" });
  assert.deepEqual([...panel.select.options].map((o) => o.value), ["deepspeed", "hf"]);
  assert.equal(panel.root.hidden, false);
  assert.match(panel.status.textContent, /^method: cannot be exported/);
  assert.ok(panel.status.classList.contains("memsim-export-error"));
});

test("Export sends the chosen format; only the answer to that request is downloaded, once", () => {
  const { window, model, downloads, cleanup, q } = mount(OFFER);
  q(".memsim-export-format").value = "hf";
  fire(window, q(".memsim-export-config"), "click");
  assert.deepEqual(model.sent.at(-1), { type: "export", format: "hf" });
  const files = { "training_args.yaml": "bf16: true\n", "model_setup.yaml": "x: 1\n" };
  model.set("export", { ...OFFER, id: 1, format: "hf", files });
  assert.deepEqual(downloads.map((d) => d.name), ["training_args.yaml", "model_setup.yaml"]);
  assert.ok(downloads.every((d) => d.href.startsWith("blob:")));
  model.set("export", { ...OFFER, id: 2, format: "hf", files });  // not asked for: no second download
  assert.equal(downloads.length, 2);
  assert.match(q(".memsim-export-status").textContent, /training_args\.yaml, model_setup\.yaml/);
  cleanup();
});
