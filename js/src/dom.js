// DOM helpers shared by every panel: element creation (each focusable element suppresses JupyterLab's
// shortcuts), select options, table heads, the "Apply" button, downloads and User Timing marks.

let uid = 0;

/** A page-unique id: `<prefix>-<n>` (the preset datalist of each widget view). */
export function nextId(prefix) {
  return `${prefix}-${++uid}`;
}

/** `<tag>` with attributes (`text` sets the text, `class` the class name) and children. Inputs, selects, text
 * areas and buttons get `data-lm-suppress-shortcuts`, so JupyterLab leaves their keys alone. */
export function h(doc, tag, attrs = {}, children = []) {
  const el = doc.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") el.textContent = v;
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v);
  }
  for (const c of children) el.append(c);
  if (["INPUT", "SELECT", "TEXTAREA", "BUTTON"].includes(el.tagName)) {
    el.setAttribute("data-lm-suppress-shortcuts", "true");
  }
  return el;
}

/** Options for `values`; a `null` value (the key left unset) is the option with value "". */
export function fillSelect(doc, select, values, labels = {}) {
  select.replaceChildren(
    ...values.map((v) =>
      h(doc, "option", { value: v === null ? "" : String(v), text: labels[String(v)] ?? String(v) }),
    ),
  );
}

/** A table head: one row of `labels`. */
export function thead(doc, labels) {
  return h(doc, "thead", {}, [h(doc, "tr", {}, labels.map((t) => h(doc, "th", { text: t })))]);
}

/** An "Apply" button, disabled unless `enabled`. */
export function applyButton(doc, attrs, enabled, text = "Apply") {
  const b = h(doc, "button", { type: "button", ...attrs, text });
  b.disabled = !enabled;
  return b;
}

/** Save `href` as the file `name` (a temporary link, clicked). */
export function download(doc, href, name) {
  const a = h(doc, "a", { href, download: name });
  doc.body.append(a);
  a.click();
  a.remove();
}

/** A User Timing mark `memsim:<name>`, the page's first only (the first widget's render, bundle import and
 * each chart's first embed): DevTools' timeline and benchmarks/first_chart.py read them. */
export function mark(name) {
  const perf = globalThis.performance;
  if (typeof perf?.mark !== "function" || perf.getEntriesByName?.(`memsim:${name}`).length) return;
  perf.mark(`memsim:${name}`);
}
