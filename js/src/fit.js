// "Make it fit": the toggle writes `fit_open`; the panel shows the `fit` trait (the smallest changes that fit,
// or how far a fitting scenario goes; how far micro-batch and sequence go on the same GPUs with any layout;
// single levers; the fewest GPUs) and holds "Layouts". Every "Apply"
// sends the entry of the result it shows ({type: "fit_apply"} or {type: "layout_apply"}, with that result's
// id); Python applies it like an edit.

import { applyButton, h, thead } from "./dom.js";
import { fmtBytes, fmtCount, fmtGiB } from "./format.js";
import { createLayoutsPanel, wireLayouts } from "./layouts.js";
import { readTrait } from "./state.js";

/** The "Make it fit" panel: a toggle, the recommendations (or headroom facts) and the "Layouts" search. */
export function createFitPanel(doc) {
  const toggle = h(doc, "button", {
    type: "button", class: "memsim-fit-toggle memsim-ctl-fit", "aria-expanded": "false", text: "Make it fit",
    title: "What to change so that this scenario fits the GPU, or how far it can be pushed when it does",
  });
  const status = h(doc, "span", { class: "memsim-fit-status", role: "status" });
  const error = h(doc, "div", { class: "memsim-fit-error", role: "alert", hidden: "" });
  const stale = h(doc, "div", { class: "memsim-fit-stale-label", hidden: "" });
  const headline = h(doc, "div", { class: "memsim-fit-headline" });
  const list = h(doc, "div", { class: "memsim-fit-list" });
  const facts = h(doc, "ul", { class: "memsim-fit-facts" });
  const levers = h(doc, "div", { class: "memsim-fit-levers" });
  const result = h(doc, "div", { class: "memsim-fit-result" }, [stale, headline, list, facts, levers]);
  const layouts = createLayoutsPanel(doc);
  const body = h(doc, "div", { class: "memsim-fit-body", hidden: "" }, [error, result, layouts.root]);
  const root = h(doc, "section", { class: "memsim-fit" }, [
    h(doc, "div", { class: "memsim-fit-bar" }, [toggle, status]), body,
  ]);
  return { root, toggle, status, body, error, result, stale, headline, list, facts, levers, layouts };
}

function changesTable(doc, items, kind, enabled) {
  const body = h(doc, "tbody");
  for (const c of items) {
    const label = h(doc, "td", { class: "memsim-col-change", text: c.label });
    if (c.changes_the_job) label.append(" ", h(doc, "span", { class: "memsim-fit-tag", text: "changes the job" }));
    body.append(h(doc, "tr", { class: `memsim-fit-row memsim-fit-${c.fits ? "yes" : "no"}` }, [
      label,
      h(doc, "td", { class: "memsim-col-size memsim-col-saved", text: fmtGiB(c.saved_gib) }),
      h(doc, "td", { class: "memsim-col-size", text: c.after, title: c.verdict }),
      h(doc, "td", { class: "memsim-col-fits", text: c.fits ? "yes" : "no" }),
      h(doc, "td", { class: "memsim-col-cost", text: c.cost }),
      h(doc, "td", {}, [applyButton(doc, { class: "memsim-fit-apply", "data-apply": kind, "data-index": String(c.index),
        title: `Set the scenario to: ${c.label}` }, enabled)]),
    ]));
  }
  const heads = thead(doc, ["change", "saves", "then", "fits", "cost", ""]);
  return h(doc, "table", { class: `memsim-table memsim-fit-table memsim-fit-table-${kind}` }, [heads, body]);
}

function fact(doc, text, kind, enabled) {
  const li = h(doc, "li", { class: `memsim-fit-fact memsim-fit-fact-${kind || "note"}` }, [text]);
  if (kind) li.append(" ", applyButton(doc, { class: "memsim-fit-apply", "data-apply": kind, "data-index": "0" }, enabled));
  return li;
}

const given = (x) => x !== null && x !== undefined;

/** How far micro-batch (`max_micro_batch_searched`) or sequence goes on the same GPUs with any layout and knobs
 * (the planner's search, global batch free), with the cheapest layout that gets there; null when none fits. */
function reachFact(doc, v, kind, what, now, enabled) {
  const r = v[kind];
  if (!r) return null;
  const gpus = v.num_gpus > 1 ? `these ${v.num_gpus} GPUs` : "this GPU";
  return fact(doc, `${what} on ${gpus} with any layout: ${r.value} (now ${now}) as ${r.layout}; ` +
    `${r.device_total} per GPU, ${fmtCount(Math.round(r.tokens_per_gpu_s))} tokens/s/GPU modelled, the cheapest of ` +
    `${fmtCount(r.reaching)} that reach it (global batch free)`, kind, enabled && r.value !== now);
}

function reachFacts(doc, v, enabled) {
  return [
    reachFact(doc, v, "max_micro_batch_searched", "largest micro-batch", v.micro_batch_size, enabled),
    reachFact(doc, v, "max_seq_len_searched", "longest sequence", v.seq_len, enabled),
  ].filter(Boolean);
}

/** A fitting scenario: the headline, and how far micro-batch and sequence go. Returns the facts. */
function renderFits(doc, panel, v, need, enabled) {
  panel.headline.replaceChildren(h(doc, "b", { class: "memsim-fit-word", text: "fits" }),
    `: ${need}, ${fmtBytes(v.spare_bytes)} to spare. How far it goes:`);
  panel.list.replaceChildren();
  const facts = [];
  if (given(v.max_micro_batch)) {
    facts.push(fact(doc, `largest micro-batch that fits: ${v.max_micro_batch} (now ${v.micro_batch_size})`,
      "max_micro_batch", enabled && v.max_micro_batch !== v.micro_batch_size));
  }
  if (given(v.max_seq_len)) {
    facts.push(fact(doc, `longest sequence that fits: ${v.max_seq_len} (now ${v.seq_len})`, "max_seq_len",
      enabled && v.max_seq_len !== v.seq_len));
  }
  return [...facts, ...reachFacts(doc, v, enabled)];
}

/** A scenario that does not fit: the headline and the smallest changes that fit. Returns the facts. */
function renderFixes(doc, panel, v, need, enabled) {
  const changes = v.changes ?? [];
  panel.headline.replaceChildren(h(doc, "b", { class: "memsim-fit-word", text: v.verdict }), `: ${need}. ` +
    (changes.length ? "Smallest changes that fit:" : `No change fits: ${v.bound ?? "no lever applies"}.`));
  panel.list.replaceChildren(...(changes.length ? [changesTable(doc, changes, "change", enabled)] : []));
  const facts = [];
  if (changes.length && v.bound) facts.push(fact(doc, `no change that keeps the job fits: ${v.bound}`, "", false));
  const first = v.with_first_fix;
  if (first && first.max_micro_batch) {
    facts.push(fact(doc, `with “${first.change}”, micro-batches up to ${first.max_micro_batch} fit`, "", false));
  }
  return [...facts, ...reachFacts(doc, v, enabled)];
}

function minGpusFact(doc, v, enabled) {
  const mg = v.min_gpus;
  if (!mg) {
    return fact(doc, "more GPUs alone do not make it fit (data parallelism with ZeRO-3 up to 4096; tp/pp layouts " +
      "up to 1024)", "", false);
  }
  const layout = `dp=${mg.dp}` + (mg.tp > 1 ? ` tp=${mg.tp}` : "") + (mg.pp > 1 ? ` pp=${mg.pp}` : "");
  return fact(doc, `fewest GPUs that fit: ${mg.num_gpus} (${layout}, ZeRO-${mg.zero}, the fastest layout there; ` +
    `${fmtBytes(mg.device_total_bytes)} per GPU; now ${v.num_gpus})`, "min_gpus", enabled && mg.num_gpus !== v.num_gpus);
}

/** The smallest catalog card that holds the scenario as it is (when it does not fit this one). */
function cardFacts(doc, v) {
  const card = v.smallest_card;
  if (v.fits) return [];
  if (!card) return [fact(doc, "no card in the catalog holds it as it is", "", false)];
  return [fact(doc, `smallest card that holds it as it is: ${card.name} (${fmtBytes(card.device_total_bytes)} per GPU)`,
    "", false)];
}

function renderLevers(doc, panel, v, enabled) {
  const levers = v.levers ?? [];
  const table = levers.length ? changesTable(doc, levers, "lever", enabled) : h(doc, "span", { text: "none applies" });
  if (v.fits) {
    panel.levers.replaceChildren(h(doc, "div", { class: "memsim-fit-subhead", text: "What each single change would save:" }),
      table);
  } else {
    panel.levers.replaceChildren(h(doc, "details", { class: "memsim-fit-levers-all" }, [
      h(doc, "summary", { text: `each single change alone (${levers.length})` }), table,
    ]));
  }
}

/** Draw the "Make it fit" panel from `fit_open` and the `fit` trait (state, error, stale, view). */
export function renderFit(doc, panel, open, fit = {}) {
  panel.toggle.setAttribute("aria-expanded", String(Boolean(open)));
  panel.root.classList.toggle("memsim-fit-open", Boolean(open));
  panel.body.hidden = !open;
  const state = fit.state ?? "idle";
  const v = fit.view;
  panel.status.textContent = !open ? "" : state === "running" ? "finding what fits…"
    : state === "done" && typeof fit.ms === "number" ? `computed in ${fit.ms.toFixed(0)} ms` : "";
  panel.error.hidden = !fit.error;
  panel.error.textContent = fit.error ? `Make it fit: ${fit.error}` : "";
  panel.result.hidden = !v;
  panel.result.classList.toggle("memsim-fit-stale", Boolean(v && fit.stale));
  panel.stale.hidden = !(v && (fit.stale || fit.rejected));
  panel.stale.textContent = fit.stale ? "For the previous scenario: updating…"
    : fit.rejected ? "For the last valid scenario (the input shown is rejected)." : "";
  if (!v) {
    for (const el of [panel.headline, panel.list, panel.facts, panel.levers]) el.replaceChildren();
    return;
  }
  const enabled = state === "done" && !fit.stale;
  const need = `${fmtBytes(v.device_total_bytes)} per GPU, ${fmtBytes(v.usable_bytes)} usable on ${v.gpu} ` +
    `(${Math.round((v.headroom ?? 0) * 100)}% headroom)`;
  const facts = (v.fits ? renderFits : renderFixes)(doc, panel, v, need, enabled);
  panel.facts.replaceChildren(...facts, minGpusFact(doc, v, enabled), ...cardFacts(doc, v));
  renderLevers(doc, panel, v, enabled);
}

/** Send the entry of an "Apply" button (fit or layout), with the id of the result it belongs to. */
function sendApply(model, button) {
  if (button.hasAttribute("data-apply")) {
    model.send({ type: "fit_apply", kind: button.getAttribute("data-apply"),
      index: Number(button.getAttribute("data-index")), id: readTrait(model, "fit")?.id });
  } else {
    model.send({ type: "layout_apply", candidate: Number(button.getAttribute("data-candidate")),
      id: readTrait(model, "layouts")?.id });
  }
}

/** Wire "Make it fit" (and its "Layouts") into a view. Returns {show, layouts: {show, draw}}. */
export function wireFit(ctx, panel) {
  const { doc, model } = ctx;
  const show = () => renderFit(doc, panel, model.get("fit_open"), readTrait(model, "fit") ?? {});
  ctx.listen(panel.toggle, "click", () => ctx.save("fit_open", !model.get("fit_open")));
  // One listener for every "Apply" button (they are redrawn with each result): Python applies the entry of
  // the result it showed (`id`), through the same path as an edit.
  ctx.listen(panel.root, "click", (event) => {
    const button = event.target?.closest?.("button[data-apply], button[data-candidate]");
    if (!button || button.disabled) return;
    sendApply(model, button);
    button.disabled = true;
    button.textContent = "Applying…";
  });
  ctx.onModel("fit_open", show);
  ctx.onModel("fit", show);
  return { show, layouts: wireLayouts(ctx, panel.layouts) };
}
