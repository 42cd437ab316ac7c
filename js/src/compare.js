// Compare: "Pin" appends the current scenario to `pins` and a remove button drops one; Python answers with
// `comparison` (the pins beside the current scenario: headline rows, differing fields, the compare chart).

import { drawCharts } from "./charts.js";
import { h } from "./dom.js";
import { readTrait } from "./state.js";

const PIN_HINT = "Pin this scenario, then change a knob: the pins and the current scenario are compared side by side";
const COMPARE_ROWS = [["peak per GPU", "peak"], ["verdict", "verdict"], ["step time", "step_time"],
  ["tokens/s per GPU", "tokens_per_second"], ["MFU", "mfu"]];

/** The compare panel: "Pin", the pins with remove buttons, a refused pin's message, the table and the chart. */
export function createComparePanel(doc) {
  const pin = h(doc, "button", { type: "button", class: "memsim-pin", text: "Pin", title: PIN_HINT });
  const status = h(doc, "span", { class: "memsim-compare-status", role: "status" });
  const pins = h(doc, "ul", { class: "memsim-pins" });
  const error = h(doc, "div", { class: "memsim-compare-error", role: "alert", hidden: "" });
  const table = h(doc, "div", { class: "memsim-compare-table-holder" });
  const chart = h(doc, "div", { class: "memsim-chart memsim-chart-compare" });
  const body = h(doc, "div", { class: "memsim-compare-body", hidden: "" }, [table, chart]);
  const bar = h(doc, "div", { class: "memsim-compare-bar" }, [h(doc, "b", { text: "Compare" }), pin, status]);
  const root = h(doc, "section", { class: "memsim-compare" }, [bar, pins, error, body]);
  return { root, pin, status, pins, error, body, table, charts: { compare: chart } };
}

/** The pins with `scenario` appended (Python checks and names it): what "Pin" writes to `pins`. */
export function withPin(pins, scenario) {
  return [...(pins ?? []), { name: "", scenario: structuredClone(scenario ?? {}) }];
}

/** The pins without entry `index`: what a remove button writes to `pins`. */
export function withoutPin(pins, index) {
  return (pins ?? []).filter((_, i) => i !== index);
}

/** The comparison as a table: headline rows, then each field that differs, a cell that differs from the
 * current scenario (the last column) highlighted. */
export function compareTable(doc, view) {
  const names = view.names ?? [];
  const thead = h(doc, "thead", {}, [h(doc, "tr", {}, [h(doc, "th"), ...names.map((n) => h(doc, "th", { text: n }))])]);
  const body = h(doc, "tbody");
  for (const [label, key] of COMPARE_ROWS) {
    body.append(h(doc, "tr", { class: `memsim-compare-row memsim-compare-${key.replace(/_/g, "-")}` }, [
      h(doc, "th", { text: label }),
      ...(view.rows ?? []).map((r) => h(doc, "td", { class: key === "verdict" ? `memsim-compare-${r.verdict.replace(/ /g, "-")}` : "", text: r[key] })),
    ]));
  }
  const diffs = view.differences ?? [];
  for (const d of diffs) {
    body.append(h(doc, "tr", { class: "memsim-compare-diff" }, [
      h(doc, "th", { text: d.field }),
      ...d.values.map((v, i) => h(doc, "td", { class: d.changed[i] ? "memsim-compare-changed" : "", text: v })),
    ]));
  }
  if (!diffs.length) {
    body.append(h(doc, "tr", { class: "memsim-compare-same" }, [h(doc, "td", { colspan: String(names.length + 1),
      text: "no scenario field differs" })]));
  }
  return h(doc, "table", { class: "memsim-table memsim-compare-table" }, [thead, body]);
}

function statusText(pins, max, rejected) {
  if (rejected) return "the input shown is rejected: fix it to pin it";
  if (pins.length >= max) return `${max} pinned: remove one to pin another`;
  return pins.length ? `${pins.length} of ${max} pinned; change a knob to compare` : PIN_HINT;
}

/** Draw the compare panel from the `comparison` trait; "Pin" is off at the limit and while the input is rejected. */
export function renderCompare(doc, panel, comparison = {}, rejected = false) {
  const pins = comparison.pins ?? [];
  const max = comparison.max_pins ?? 3;
  panel.pin.disabled = rejected || pins.length >= max;
  panel.status.textContent = statusText(pins, max, rejected);
  panel.pins.replaceChildren(...pins.map((p, i) => h(doc, "li", { class: "memsim-pin-item" }, [
    h(doc, "b", { text: p.name }), `: ${p.summary} `,
    h(doc, "button", { type: "button", class: "memsim-unpin", "data-unpin": String(i), text: "remove",
      title: `Remove ${p.name} from the comparison` }),
  ])));
  panel.error.hidden = !comparison.error;
  panel.error.textContent = comparison.error ? `Pin refused: ${comparison.error}` : "";
  const view = comparison.view;
  panel.body.hidden = !view;
  panel.table.replaceChildren(...(view ? [compareTable(doc, view)] : []));
}

/** Wire the compare panel into a view: "Pin" and remove write `pins`, Python answers with `comparison`.
 * Shows it and draws its chart at once. */
export function wireCompare(ctx, panel) {
  const { doc, model } = ctx;
  const show = () => renderCompare(doc, panel, readTrait(model, "comparison") ?? {}, Boolean(model.get("error")));
  ctx.listen(panel.pin, "click", () => {
    if (!panel.pin.disabled) ctx.save("pins", withPin(model.get("pins"), model.get("scenario_data")));
  });
  ctx.listen(panel.pins, "click", (event) => {
    const button = event.target?.closest?.("button[data-unpin]");
    if (button) ctx.save("pins", withoutPin(model.get("pins"), Number(button.getAttribute("data-unpin"))));
  });
  ctx.onModel("comparison", show);
  ctx.onModel("error", show);
  const draw = drawCharts(ctx, panel.charts, () => {
    const chart = readTrait(model, "comparison")?.view?.chart;
    return chart ? { compare: chart } : {};
  }, ["comparison"]);
  show();
  draw();
}
