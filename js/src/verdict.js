// The result: the verdict panel (verdict, peaks with the counters that measure them, bottleneck, caveats,
// scaling summary) and the breakdown table with its CSV download, all from the `result` trait.

import { h, thead } from "./dom.js";
import { fmtBytes, rowsToCsv } from "./format.js";

function verdictHead(doc, result) {
  const total = result.peaks?.[0];
  return h(doc, "div", { class: "memsim-verdict-head" }, [
    h(doc, "span", { class: "memsim-verdict-word", text: result.verdict }),
    h(doc, "span", {
      class: "memsim-verdict-peak",
      text: ` peak ${total ? total.size : "?"} (${total ? total.label : ""}) at ${result.peak_moment} on ` +
        `${result.peak_rank}; ${result.gpu?.name} holds ${result.gpu?.memory_gib} GiB, ` +
        `${Math.round(result.headroom * 100)}% headroom leaves ${fmtBytes(result.usable_bytes)}`,
    }),
  ]);
}

/** The headline peaks, each with its counter; with several pipeline stages each names the stage whose
 * figure it is (per counter, the worst stage). */
function peakList(doc, peaks, staged) {
  return h(doc, "ul", { class: "memsim-peaks" }, (peaks ?? []).map((p) =>
    h(doc, "li", { class: `memsim-peak memsim-peak-${p.label}` }, [
      h(doc, "b", { text: `${p.label} ${p.size}` }),
      ...(staged && p.rank ? [h(doc, "span", { class: "memsim-peak-rank", text: ` on ${p.rank}` })] : []),
      ` predicts ${p.counter}`,
    ]),
  ));
}

/** What the scaling summary says while Python computes the new scenario's scaling view in the background. */
export const SCALING_PENDING_TEXT = "largest micro-batch and longest sequence that fit: updating…";

/** The scaling summary in words: the largest micro-batch and longest sequence that fit ('' for none);
 * `pending` (computed in the background): no number, the previous scenario's would be wrong. */
export function scalingText(s) {
  if (s.pending) return SCALING_PENDING_TEXT;
  if (s.error) return `how it scales: ${s.error}`;
  const parts = [];
  const mb = s.micro_batch_size;
  if (mb) {
    parts.push(`largest micro-batch that fits: ${mb.max_fit ?? "none"}` +
      (mb.exceeds_at !== null && mb.exceeds_at !== undefined ? ` (exceeds the GPU at ≈${mb.exceeds_at})` : ""));
  }
  if (s.seq_len?.fixed) parts.push(`sequence fixed at ${s.seq_len.fixed}`);
  else if (s.seq_len) parts.push(`longest sequence that fits: ${s.seq_len.max_fit ?? "none"}`);
  return parts.join("; ");
}

/** Fill the verdict panel from `result` (verdict, peaks with their counters, bottleneck, scaling summary). */
export function renderVerdict(doc, el, result) {
  if (!result || !result.verdict) {
    el.replaceChildren();
    return;
  }
  const extra = [];
  // under reserved_model: replay, the replay on the card: runs, runs only by releasing the cache, or why it ran out
  if (result.verdict_text) {
    extra.push(h(doc, "div", { class: `memsim-verdict-replay memsim-verdict-replay-${result.verdict_reason.replace(/ /g, "-")}`, text: result.verdict_text }));
  }
  extra.push(h(doc, "div", { class: "memsim-bottleneck", text: result.bottleneck?.text ?? "" }));
  for (const c of result.caveats ?? []) extra.push(h(doc, "div", { class: "memsim-caveat", text: `caveat: ${c}` }));
  const scaling = scalingText(result.scaling ?? {});
  if (scaling) {
    const cls = `memsim-scaling-summary${result.scaling?.pending ? " memsim-scaling-pending" : ""}`;
    extra.push(h(doc, "div", { class: cls, text: scaling }));
  }
  el.className = `memsim-verdict memsim-verdict-${result.verdict.replace(/ /g, "-")}`;
  el.replaceChildren(verdictHead(doc, result), peakList(doc, result.peaks, (result.per_rank ?? []).length > 1), ...extra);
}

/** The breakdown rows as an HTML table (rank, moment, category, item, size, counter, formula). */
export function buildTable(doc, rows) {
  const cols = [["rank", "rank"], ["moment", "moment"], ["category", "category"], ["item", "item"],
    ["size", "size"], ["counter", "counted by"], ["formula", "formula"]];
  const body = h(doc, "tbody");
  for (const r of rows ?? []) {
    const tr = h(doc, "tr", { class: `memsim-row memsim-cat-${r.category}` });
    for (const [c] of cols) {
      const text = c === "size" ? fmtBytes(r.bytes) : String(r[c] ?? "");
      tr.append(h(doc, "td", { class: `memsim-col-${c}`, text }));
    }
    body.append(tr);
  }
  return h(doc, "table", { class: "memsim-table" }, [thead(doc, cols.map(([, t]) => t)), body]);
}

/** The verdict panel and the "breakdown table" details (a CSV link and the table). */
export function createResultViews(doc) {
  const verdict = h(doc, "div", { class: "memsim-verdict" });
  const holder = h(doc, "div", { class: "memsim-table-holder" });
  const csv = h(doc, "a", { class: "memsim-csv", download: "memsim-breakdown.csv", text: "download CSV" });
  const details = h(doc, "details", { class: "memsim-details-table" }, [
    h(doc, "summary", { text: "breakdown table" }), csv, holder,
  ]);
  return { verdict, details, holder, csv };
}

/** Show `result` in the verdict panel, the table and the CSV link. */
export function renderResult(doc, views, result = {}) {
  renderVerdict(doc, views.verdict, result);
  views.holder.replaceChildren(buildTable(doc, result.rows ?? []));
  views.csv.href = "data:text/csv;charset=utf-8," + encodeURIComponent(rowsToCsv(result.rows ?? []));
}
