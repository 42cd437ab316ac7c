// "Layouts", inside "Make it fit": "Search layouts" sends {type: "layouts", gpus}; the `layouts` trait brings
// the best candidates (each marked `current` by Python when the scenario uses it) and the candidates chart;
// a candidate's "Apply" sends {type: "layout_apply"} (wired with the fit panel's Apply buttons).

import { drawCharts } from "./charts.js";
import { applyButton, h, thead } from "./dom.js";
import { fmtBytes, fmtCount } from "./format.js";
import { readTrait } from "./state.js";

/** A candidate's layout in a few words: `dp=4 tp=2 pp=1 cp=1, ZeRO-1, sp`. */
export function layoutText(r) {
  return `${r.layout}, ZeRO-${r.zero}${r.sequence_parallel ? ", sp" : ""}`;
}

/** A candidate's memory knobs in a few words: `selective ckpt, chunked loss, adamw-8bit, offload optimizer`. */
export function knobsText(r) {
  const parts = [r.activation_checkpointing === "none" ? "no ckpt" : `${r.activation_checkpointing} ckpt`,
    `${r.loss} loss`, r.optimizer];
  if (r.offload && r.offload !== "none") parts.push(`offload ${r.offload}`);
  return parts.join(", ");
}

/** The "Layouts" part: the search bar (button, GPU count, status), error, and the result with its chart. */
export function createLayoutsPanel(doc) {
  const run = h(doc, "button", {
    type: "button", class: "memsim-layouts-run", text: "Search layouts",
    title: "Try every dp/tp/pp/cp layout and memory knob on this GPU type and rank what fits (throughput proxy)",
  });
  const gpus = h(doc, "input", { type: "number", class: "memsim-layouts-gpus", min: "1", step: "1",
    "aria-label": "GPUs to search" });
  const status = h(doc, "span", { class: "memsim-layouts-status", role: "status" });
  const error = h(doc, "div", { class: "memsim-layouts-error", role: "alert", hidden: "" });
  const stale = h(doc, "div", { class: "memsim-layouts-stale-label", hidden: "" });
  const summary = h(doc, "div", { class: "memsim-layouts-summary" });
  const table = h(doc, "div", { class: "memsim-layouts-table-holder" });
  const chart = h(doc, "div", { class: "memsim-chart memsim-chart-candidates" });
  const result = h(doc, "div", { class: "memsim-layouts-result", hidden: "" }, [stale, summary, table, chart]);
  const root = h(doc, "div", { class: "memsim-layouts" }, [
    h(doc, "div", { class: "memsim-layouts-bar" }, [
      h(doc, "b", { text: "Layouts" }), run, h(doc, "span", { text: "on" }), gpus, h(doc, "span", { text: "GPUs" }),
      status,
    ]),
    error, result,
  ]);
  return { root, run, gpus, status, error, result, stale, summary, table, charts: { candidates: chart } };
}

/** Which formats export a candidate (text), and each refusal naming its field (tooltip). */
export function exportsText(r) {
  const all = Object.entries(r.exports ?? {});
  const ok = all.filter(([, why]) => why === null).map(([fmt]) => fmt);
  const no = all.filter(([, why]) => why !== null).map(([fmt, why]) => `${fmt}: ${why}`);
  return { text: ok.length ? ok.join(", ") : "none", title: no.length ? `not exported:\n${no.join("\n")}` : "every format" };
}

function summaryText(layouts, v) {
  const counts = (v.gpu_counts ?? []).join(", ");
  return (v.widened ? v.widened.charAt(0).toUpperCase() + v.widened.slice(1) : "") + `${fmtCount(v.evaluated)} candidates for ${v.model} on ${counts} × ${v.gpu}: ${fmtCount(v.fitting)} fit` +
    (typeof layouts.ms === "number" ? ` (searched in ${layouts.ms.toFixed(0)} ms)` : "") +
    (v.fitting ? ". Best by modelled tokens/s per GPU:" : ". Nothing fits: try more GPUs, or a change above.");
}

/** One candidate row; `ok`: its "Apply" can be used (the search is current and done). */
function layoutRow(doc, r, ok) {
  const current = Boolean(r.current);
  return h(doc, "tr", { class: `memsim-layout-row${current ? " memsim-layout-current" : ""}` }, [
    h(doc, "td", { text: String(r.rank) }),
    h(doc, "td", { class: "memsim-col-layout", text: layoutText(r) }),
    h(doc, "td", { class: "memsim-col-mb", text: `${r.micro_batch_size} × ${r.grad_accum_steps}`,
      title: "micro-batch × gradient accumulation steps" }),
    h(doc, "td", { class: "memsim-col-knobs", text: knobsText(r) }),
    h(doc, "td", { class: "memsim-col-size", text: fmtBytes(r.device_total_bytes) }),
    h(doc, "td", { class: "memsim-col-size", text: Number(r.tokens_per_gpu_s).toLocaleString("en-US", { maximumFractionDigits: 0 }) }),
    h(doc, "td", { class: "memsim-col-exports", ...exportsText(r) }),
    h(doc, "td", {}, [applyButton(doc, { class: "memsim-layout-apply", "data-candidate": String(r.candidate),
      title: current ? "the scenario uses this layout" : "Set the scenario to this layout" }, ok && !current,
    current ? "current" : "Apply")]),
  ]);
}

/** Draw the "Layouts" part from the `layouts` trait; `scenario` gives the GPU count shown as placeholder. */
export function renderLayouts(doc, panel, layouts = {}, scenario = {}) {
  const state = layouts.state ?? "idle";
  const running = state === "running";
  panel.run.disabled = running;
  panel.run.textContent = running ? "Searching…" : "Search layouts";
  panel.gpus.placeholder = String(scenario.num_gpus ?? 1);
  panel.status.textContent = running ? "searching layouts…" : "";
  panel.error.hidden = !layouts.error;
  panel.error.textContent = layouts.error ? `Layouts: ${layouts.error}` : "";
  const v = layouts.view;
  panel.result.hidden = !v;
  if (!v) {
    panel.summary.replaceChildren();
    panel.table.replaceChildren();
    return;
  }
  const stale = Boolean(layouts.stale);
  panel.result.classList.toggle("memsim-layouts-stale", stale);
  panel.stale.hidden = !stale;
  const keys = layouts.stale_keys ?? [];
  panel.stale.textContent = stale
    ? `Searched for another scenario${keys.length ? ` (${keys.join(", ")} changed since)` : ""}. Search again.` : "";
  panel.summary.textContent = summaryText(layouts, v);
  const rows = v.top ?? [];
  if (!rows.length) {
    panel.table.replaceChildren();
    return;
  }
  const heads = thead(doc, ["#", "layout", "micro-batch", "knobs", "memory", "tokens/s/GPU", "exports to", ""]);
  const body = h(doc, "tbody", {}, rows.map((r) => layoutRow(doc, r, !running && !stale)));
  panel.table.replaceChildren(h(doc, "table", { class: "memsim-table memsim-layouts-table" }, [heads, body]));
}

/** Wire "Layouts" into a view: the search button, and `layouts` / `scenario_data` redraw it. Returns
 * {show, draw}. */
export function wireLayouts(ctx, panel) {
  const { doc, model } = ctx;
  const show = () => renderLayouts(doc, panel, readTrait(model, "layouts") ?? {}, model.get("scenario_data") ?? {});
  ctx.listen(panel.run, "click", () => {
    const n = Number.parseInt(panel.gpus.value, 10);
    model.send({ type: "layouts", gpus: Number.isFinite(n) && n > 0 ? n : null });
  });
  ctx.onModel("scenario_data", show);
  ctx.onModel("layouts", show);
  const draw = drawCharts(ctx, panel.charts, () => {
    const chart = readTrait(model, "layouts")?.view?.chart;
    return chart ? { candidates: chart } : {};
  }, ["layouts"]);
  return { show, draw };
}
