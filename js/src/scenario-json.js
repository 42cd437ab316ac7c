// "scenario JSON": the scenario as editable JSON text, a copy button, and "apply JSON", which writes the
// parsed object to `scenario_data` (Python checks it like any edit).

import { h } from "./dom.js";

/** The "scenario JSON" details: the text area and its copy / apply buttons. */
export function createJsonEditor(doc) {
  const area = h(doc, "textarea", { class: "memsim-json", rows: "14", spellcheck: "false" });
  const copy = h(doc, "button", { type: "button", class: "memsim-copy", text: "copy" });
  const apply = h(doc, "button", { type: "button", class: "memsim-apply", text: "apply JSON" });
  const root = h(doc, "details", { class: "memsim-details-json" }, [
    h(doc, "summary", { text: "scenario JSON" }), area, h(doc, "div", { class: "memsim-tools" }, [copy, apply]),
  ]);
  return { root, area, copy, apply };
}

/** The scenario object in `text`, or {error} when it is not JSON or not an object. */
export function parseScenario(text) {
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    return { error: `scenario JSON: ${err.message}` };
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
    return { error: "scenario JSON: must be an object ({...})" };
  }
  return { scenario: parsed };
}

/** Wire the editor into a view; `fail(message)` shows a parse error. Returns `sync()`: show the model's
 * scenario unless the text area has the focus (someone is typing). */
export function wireJsonEditor(ctx, editor, fail) {
  const { doc, model } = ctx;
  ctx.listen(editor.copy, "click", async () => {
    editor.area.select();
    try {
      await navigator.clipboard.writeText(editor.area.value);
    } catch {
      doc.execCommand?.("copy");
    }
  });
  ctx.listen(editor.apply, "click", () => {
    const { scenario, error } = parseScenario(editor.area.value);
    if (error) fail(error);
    else ctx.save("scenario_data", scenario);
  });
  return () => {
    if (doc.activeElement !== editor.area) editor.area.value = JSON.stringify(model.get("scenario_data") ?? {}, null, 2);
  };
}
