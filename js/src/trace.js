// "Verify with trace": the button sends {type: "verify"} (or {type: "cancel"} while a trace runs); the panel
// shows the `trace` trait (state, availability, progress, staleness) and `trace_view` (traced vs simulated
// peak, per category, notes, and the comparison and timeline charts).

import { drawCharts } from "./charts.js";
import { h, thead } from "./dom.js";
import { fmtBytes, fmtCount, fmtPct } from "./format.js";
import { readTrait } from "./state.js";

const TRACE_HINT = "Trace two training steps of this scenario on fake tensors (CPU, nothing allocated) " +
  "and compare the measured live tensor bytes with the simulation";

/** One line for a running trace: stage (until the tracker runs), step and phase, ops, bytes, elapsed time. */
export function traceProgressText(p = {}) {
  const parts = [];
  if (p.step === undefined) {
    parts.push(p.stage ?? "starting");
  } else {
    parts.push(p.step >= 1 ? `step ${p.step}/${p.steps ?? 2}: ${p.phase ?? ""}` : String(p.phase ?? p.stage));
    parts.push(`${fmtCount(p.ops)} ops`);
    if (p.live_bytes !== undefined) parts.push(`${fmtBytes(p.live_bytes)} live`);
    if (p.peak_bytes) parts.push(`peak so far ${fmtBytes(p.peak_bytes)}`);
  }
  if (p.elapsed_s !== undefined) parts.push(`${Number(p.elapsed_s).toFixed(1)} s`);
  return parts.join(" · ");
}

/** How far off the simulation is: `memsim-err-ok` (within 2%), `memsim-err-warn` (5%) or `memsim-err-bad`. */
export function errorClass(pct) {
  if (pct === null || pct === undefined) return "memsim-err-none";
  const a = Math.abs(pct);
  return a <= 2 ? "memsim-err-ok" : a <= 5 ? "memsim-err-warn" : "memsim-err-bad";
}

/** The "Verify with trace" panel: button, status, reason, progress, and the result with its two charts. */
export function createTracePanel(doc) {
  const button = h(doc, "button", { type: "button", class: "memsim-verify memsim-ctl-verify", text: "Verify with trace" });
  const status = h(doc, "span", { class: "memsim-trace-status", role: "status" });
  const reason = h(doc, "div", { class: "memsim-trace-reason", hidden: "" });
  const bar = h(doc, "progress", { class: "memsim-trace-progress", max: "1" });
  const progressText = h(doc, "span", { class: "memsim-trace-progress-text" });
  const progress = h(doc, "div", { class: "memsim-trace-running", hidden: "" }, [bar, progressText]);
  const stale = h(doc, "div", { class: "memsim-trace-stale-label", hidden: "" });
  const headline = h(doc, "div", { class: "memsim-trace-headline" });
  const tableHolder = h(doc, "div", { class: "memsim-trace-table-holder" });
  const charts = {
    comparison: h(doc, "div", { class: "memsim-chart memsim-chart-trace-comparison" }),
    timeline: h(doc, "div", { class: "memsim-chart memsim-chart-trace-timeline" }),
  };
  const notes = h(doc, "details", { class: "memsim-trace-notes", hidden: "" });
  const result = h(doc, "div", { class: "memsim-trace-result", hidden: "" }, [
    stale, headline, tableHolder, h(doc, "div", { class: "memsim-trace-charts" }, [charts.comparison, charts.timeline]),
    notes,
  ]);
  const root = h(doc, "section", { class: "memsim-trace" }, [
    h(doc, "div", { class: "memsim-trace-bar" }, [button, status]), reason, progress, result,
  ]);
  return { root, button, status, reason, progress, bar, progressText, result, stale, headline, tableHolder, charts, notes };
}

function traceTable(doc, categories) {
  const body = h(doc, "tbody");
  for (const c of categories ?? []) {
    body.append(h(doc, "tr", { class: `memsim-trace-row memsim-cat-${c.category}` }, [
      h(doc, "td", { class: "memsim-col-category", text: c.category }),
      h(doc, "td", { class: "memsim-col-size", text: fmtBytes(c.traced) }),
      h(doc, "td", { class: "memsim-col-size", text: fmtBytes(c.simulated) }),
      h(doc, "td", { class: `memsim-col-error ${errorClass(c.error_pct)}`, text: fmtPct(c.error_pct) }),
    ]));
  }
  const heads = thead(doc, ["category", "traced", "simulated", "error"]);
  return h(doc, "table", { class: "memsim-table memsim-trace-table" }, [heads, body]);
}

/** Allocated, reserved and nvidia-smi: the traced run's (its allocations replayed through the caching allocator)
 * against the simulation's. */
export function countersTable(doc, counters) {
  const body = h(doc, "tbody");
  for (const c of counters ?? []) {
    body.append(h(doc, "tr", { class: "memsim-trace-counter" }, [
      h(doc, "td", { class: "memsim-col-category", text: c.counter }),
      h(doc, "td", { class: "memsim-col-size", text: fmtBytes(c.traced) }),
      h(doc, "td", { class: "memsim-col-size", text: fmtBytes(c.simulated) }),
      h(doc, "td", { class: `memsim-col-error ${errorClass(c.error_pct)}`, text: fmtPct(c.error_pct) }),
    ]));
  }
  const heads = thead(doc, ["counter", "traced (replayed)", "simulated", "error"]);
  return h(doc, "table", { class: "memsim-table memsim-trace-counters" }, [heads, body]);
}

/** The traced rank of a multi-GPU job in words, and the simulated stage it is held to (nothing for 1 GPU). */
export function rankLine(doc, rank) {
  if (!rank || Number(rank.world_size ?? 1) <= 1) return [];
  const sim = rank.simulated_role ? ` (simulated: ${rank.simulated_role})` : "";
  return [h(doc, "div", { class: "memsim-trace-rank", text: `traced ${rank.role || `rank ${rank.index}`}${sim}` })];
}

function statusText(trace) {
  const state = trace.state ?? "idle";
  const p = trace.progress ?? {};
  if (state === "running") return trace.running_stale ? "tracing the scenario as it was when you clicked" : "tracing…";
  if (state === "cancelling") return "cancelling…";
  if (state === "done") return `traced in ${Number(p.elapsed_s ?? 0).toFixed(1)} s (${fmtCount(p.ops)} ops)`;
  if (state === "error") return `trace failed: ${trace.error ?? ""}`;
  if (state === "cancelled") return "trace cancelled";
  return "";
}

/** The button (verify, cancel or cancelling; disabled with the reason when tracing is unavailable). */
function renderButton(panel, trace) {
  const state = trace.state ?? "idle";
  const running = state === "running";
  const cancelling = state === "cancelling";
  const available = trace.available !== false;
  const { button } = panel;
  button.textContent = running ? "Cancel trace" : cancelling ? "Cancelling…" : "Verify with trace";
  button.disabled = cancelling || (!running && !available);
  button.title = running ? "Stop the trace (it stops at its next module call)" : available ? TRACE_HINT : (trace.reason ?? "");
  button.setAttribute("data-state", state);
  const off = !available && !running && !cancelling;
  panel.root.classList.toggle("memsim-trace-off", off);
  panel.reason.hidden = !off;
  panel.reason.textContent = off ? `Verify with trace is off: ${trace.reason ?? ""}` : "";
}

/** Status line and progress bar (indeterminate until step 2 gives a measure). */
function renderProgress(panel, trace) {
  const state = trace.state ?? "idle";
  const busy = state === "running" || state === "cancelling";
  const p = trace.progress ?? {};
  panel.status.textContent = statusText(trace);
  panel.status.className = `memsim-trace-status memsim-trace-status-${state}`;
  panel.progress.hidden = !busy;
  if (typeof p.fraction === "number") panel.bar.value = p.fraction;
  else panel.bar.removeAttribute("value");
  panel.progressText.textContent = busy ? traceProgressText(p) : "";
}

function renderSummary(doc, panel, summary) {
  const t = summary.traced ?? {};
  const s = summary.simulated ?? {};
  panel.headline.replaceChildren(
    ...rankLine(doc, summary.rank),
    "traced peak ",
    h(doc, "b", { class: "memsim-trace-traced", text: fmtBytes(t.bytes ?? 0) }),
    ` at ${t.phase ?? "?"} (step ${t.step ?? "?"}${t.op ? `, ${t.op}` : ""}); simulated `,
    h(doc, "b", { class: "memsim-trace-simulated", text: fmtBytes(s.bytes ?? 0) }),
    ` at ${s.phase ?? "?"}; simulation error `,
    h(doc, "b", { class: `memsim-trace-error ${errorClass(summary.error_pct)}`, text: fmtPct(summary.error_pct) }),
    ` (${summary.model ?? "model"}, live tensor bytes)`,
  );
  const counters = summary.counters ?? [];
  const onCard = summary.on_card ? [h(doc, "div", { class: "memsim-trace-on-card", text: summary.on_card })] : [];
  panel.tableHolder.replaceChildren(
    traceTable(doc, summary.categories), ...(counters.length ? [countersTable(doc, counters)] : []), ...onCard,
  );
  const notes = summary.notes ?? [];
  panel.notes.hidden = notes.length === 0;
  panel.notes.replaceChildren(
    h(doc, "summary", { text: `trace notes (${notes.length})` }),
    h(doc, "ul", {}, notes.map((n) => h(doc, "li", { text: n }))),
  );
}

/** Draw the trace panel from the `trace` trait (state, availability, progress, staleness) and `trace_view`. */
export function renderTrace(doc, panel, trace = {}, view = {}) {
  renderButton(panel, trace);
  renderProgress(panel, trace);
  const summary = view?.summary;
  panel.result.hidden = !summary;
  const stale = Boolean(summary && trace.stale);
  panel.result.classList.toggle("memsim-trace-stale", stale);
  panel.stale.hidden = !stale;
  const keys = trace.stale_keys ?? [];
  panel.stale.textContent = stale
    ? `Stale: traced for another scenario${keys.length ? ` (${keys.join(", ")} changed since)` : ""}. ` +
      "Verify again to trace the current one."
    : "";
  if (summary) {
    renderSummary(doc, panel, summary);
    return;
  }
  panel.headline.replaceChildren();
  panel.tableHolder.replaceChildren();
  panel.notes.replaceChildren();
  panel.notes.hidden = true;
}

/** Wire the trace panel into a view: the button sends verify or cancel, `trace` and `trace_view` redraw it.
 * Returns {show, draw}. */
export function wireTrace(ctx, panel) {
  const { doc, model } = ctx;
  const show = () => renderTrace(doc, panel, model.get("trace") ?? {}, readTrait(model, "trace_view") ?? {});
  ctx.listen(panel.button, "click", () => {
    // While a trace runs the button cancels it. Python ignores requests it cannot serve anyway.
    if (panel.button.disabled) return;
    model.send({ type: model.get("trace")?.state === "running" ? "cancel" : "verify" });
  });
  ctx.onModel("trace", show);
  ctx.onModel("trace_view", show);
  const draw = drawCharts(ctx, panel.charts, () => readTrait(model, "trace_view")?.charts, ["trace_view"]);
  return { show, draw };
}
