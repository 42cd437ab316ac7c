// MemSim front end: plain ES module for anywidget. Python owns every derived value; this file draws the
// controls from `options`, writes `scenario_data` / `headroom` back, and shows `result`, `error` and `charts`.
// "Verify with trace" sends {type: "verify"} / {type: "cancel"} messages and shows `trace` and `trace_view`.
// "Make it fit" writes `fit_open`, shows `fit` and `layouts`, and sends {type: "fit_apply"}, {type: "layouts"} and
// {type: "layout_apply"} messages; Python applies them like an edit. "Pin" and remove write `pins`; Python answers
// with `comparison` (the pins beside the current scenario: table and chart).
// Logic lives in small exported functions so `node --test tests/js/` can check it without a browser.

/** Every control: scenario key (dotted for nested keys), label, kind, fieldset. */
export const CONTROLS = [
  { key: "model", label: "model", kind: "model", group: "Model" },
  { key: "model.hidden_size", label: "hidden size", kind: "dim", group: "Model" },
  { key: "model.num_hidden_layers", label: "layers", kind: "dim", group: "Model" },
  { key: "model.num_attention_heads", label: "heads", kind: "dim", group: "Model" },
  { key: "model.num_key_value_heads", label: "kv heads", kind: "dim", group: "Model" },
  { key: "model.intermediate_size", label: "intermediate", kind: "dim", group: "Model" },
  { key: "model.vocab_size", label: "vocab", kind: "dim", group: "Model" },
  { key: "gpu", label: "GPU", kind: "gpu", group: "Hardware" },
  { key: "gpu.memory_gib", label: "memory (GiB)", kind: "number", group: "Hardware" },
  { key: "headroom", label: "headroom", kind: "headroom", group: "Hardware" },
  { key: "micro_batch_size", label: "micro-batch", kind: "log", group: "Batch" },
  { key: "seq_len", label: "sequence length", kind: "log", group: "Batch" },
  { key: "grad_accum_steps", label: "grad accumulation", kind: "int", group: "Batch" },
  { key: "precision", label: "precision", kind: "select", group: "Training" },
  { key: "optimizer", label: "optimizer", kind: "select", group: "Training" },
  { key: "optimizer_impl", label: "implementation", kind: "select", group: "Training" },
  { key: "optimizer_in_backward", label: "optimizer in backward", kind: "bool", group: "Training" },
  { key: "activation_checkpointing", label: "checkpointing", kind: "select", group: "Training" },
  { key: "checkpoint_every", label: "checkpoint every N layers", kind: "int", group: "Training" },
  { key: "attention", label: "attention", kind: "select", group: "Training" },
  { key: "loss", label: "loss", kind: "select", group: "Training" },
  { key: "framework", label: "framework", kind: "select", group: "Training" },
  { key: "output_lifetime", label: "outputs kept", kind: "select", group: "Training" },
  { key: "method", label: "method", kind: "select", group: "Method" },
  { key: "lora.rank", label: "LoRA rank", kind: "int", group: "Method" },
  { key: "lora.alpha", label: "LoRA alpha", kind: "number", group: "Method" },
  { key: "lora.adapter_dtype", label: "adapter dtype", kind: "select", group: "Method" },
  { key: "lora.targets", label: "LoRA targets", kind: "targets", group: "Method" },
  { key: "objective", label: "objective", kind: "select", group: "Objective" },
  { key: "rl.num_generations", label: "G (completions per prompt)", kind: "int", group: "Objective" },
  { key: "rl.completion_len", label: "completion length", kind: "int", group: "Objective" },
  { key: "rl.reference", label: "reference model", kind: "select", group: "Objective" },
  { key: "rl.rollout", label: "rollout engine", kind: "select", group: "Objective" },
  { key: "rl.gpu_memory_utilization", label: "vLLM gpu_memory_utilization", kind: "number", group: "Objective" },
  { key: "rl.sleep_mode", label: "vLLM sleep mode", kind: "select", group: "Objective" },
  { key: "parallel.dp", label: "dp", kind: "int", group: "Parallel" },
  { key: "parallel.tp", label: "tp", kind: "int", group: "Parallel" },
  { key: "parallel.pp", label: "pp", kind: "int", group: "Parallel" },
  { key: "parallel.cp", label: "cp", kind: "int", group: "Parallel" },
  { key: "parallel.ep", label: "ep", kind: "int", group: "Parallel" },
  { key: "parallel.zero", label: "ZeRO stage", kind: "select", group: "Parallel" },
  { key: "parallel.sequence_parallel", label: "sequence parallel", kind: "bool", group: "Parallel" },
  { key: "parallel.reshard_after_forward", label: "reshard after forward", kind: "bool", group: "Parallel" },
  { key: "parallel.offload", label: "offload", kind: "select", group: "Parallel" },
  { key: "parallel.pp_schedule", label: "pp schedule", kind: "select", group: "Parallel" },
  { key: "parallel.pp_microbatches", label: "pp micro-batches", kind: "int", group: "Parallel" },
  { key: "parallel.virtual_stages", label: "virtual stages", kind: "int", group: "Parallel" },
];

const CONTROL_KEYS = new Set(CONTROLS.map((c) => c.key));
const CSV_COLUMNS = ["rank", "stage", "moment", "category", "item", "bytes", "gib", "counter", "formula"];
let uid = 0;

/** Stable class name of a control: `memsim-ctl-<key>` with dots as dashes (`memsim-ctl-parallel-tp`). */
export function ctlClass(key) {
  return "memsim-ctl-" + key.replace(/\./g, "-");
}

/** Value at a dotted key (`parallel.tp`, `model.hidden_size`); undefined when absent. */
export function getPath(obj, key) {
  let cur = obj;
  for (const part of key.split(".")) {
    if (cur === null || typeof cur !== "object") return undefined;
    cur = cur[part];
  }
  return cur;
}

/** A deep copy of `obj` with the dotted `key` set to `value` (objects are created on the way). */
export function setPath(obj, key, value) {
  const out = structuredClone(obj ?? {});
  const parts = key.split(".");
  let cur = out;
  for (const part of parts.slice(0, -1)) {
    if (cur[part] === null || typeof cur[part] !== "object") cur[part] = {};
    cur = cur[part];
  }
  cur[parts[parts.length - 1]] = value;
  return out;
}

/** Index of the largest stop <= value (0 when below every stop). */
export function logIndex(stops, value) {
  let idx = 0;
  stops.forEach((s, i) => {
    if (s <= value) idx = i;
  });
  return idx;
}

const parsed = new WeakMap();

/** A trait that Python may send as JSON text (options, result, charts): parsed once per new value. */
export function readTrait(model, key) {
  const value = model.get(key);
  if (typeof value !== "string") return value;
  let cache = parsed.get(model);
  if (!cache) parsed.set(model, (cache = new Map()));
  const hit = cache.get(key);
  if (hit && hit.text === value) return hit.value;
  const out = value ? JSON.parse(value) : {};
  cache.set(key, { text: value, value: out });
  return out;
}

/** Human-readable binary size, like Python's `fmt_bytes` (`14.96 GiB`). */
export function fmtBytes(n) {
  const units = [["GiB", 1024 ** 3], ["MiB", 1024 ** 2], ["KiB", 1024]];
  for (const [unit, size] of units) {
    if (Math.abs(n) >= size) return `${(n / size).toFixed(2)} ${unit}`;
  }
  return `${Math.trunc(n)} B`;
}

/** The control a ScenarioError field points at (`model.n_head` -> `model`, `num_gpus` -> `parallel.dp`). */
export function controlForField(field) {
  if (!field) return null;
  if (field === "num_gpus") return "parallel.dp";
  const parts = field.split(".");
  while (parts.length) {
    const key = parts.join(".");
    if (CONTROL_KEYS.has(key)) return key;
    parts.pop();
  }
  return null;
}

/** The scenario after a control moved to `raw` (already parsed for its kind); never mutates `scenario`. */
export function applyControl(scenario, key, raw, options = {}) {
  if (key === "model") {
    const text = String(raw).trim();
    if (text === "custom") {
      const current = scenario.model;
      if (current && typeof current === "object") return structuredClone(scenario);
      return { ...structuredClone(scenario), model: { model_type: "llama", ...(options.model_dims ?? {}) } };
    }
    return { ...structuredClone(scenario), model: text };
  }
  if (key === "gpu") {
    if (raw === "custom") {
      const current = scenario.gpu;
      if (current && typeof current === "object") return structuredClone(scenario);
      const known = (options.gpus ?? []).find((g) => g.id === current);
      return { ...structuredClone(scenario), gpu: { memory_gib: known ? known.memory_gib : 80 } };
    }
    return { ...structuredClone(scenario), gpu: raw };
  }
  return setPath(scenario, key, raw);
}

/** Parse an element's value for a control kind (numbers for numeric choices, stops for log sliders). */
export function readControl(ctl, el, options = {}) {
  switch (ctl.kind) {
    case "bool":
      return el.checked;
    case "int":
    case "dim":
      return Number.parseInt(el.value, 10);
    case "number":
      return Number.parseFloat(el.value);
    case "log": {
      const stops = options.stops?.[ctl.key] ?? [];
      return stops[Number.parseInt(el.value, 10)] ?? stops[0];
    }
    case "select": {
      const choices = options.choices?.[ctl.key] ?? [];
      if (el.value === "" && choices.includes(null)) return null; // the unset choice (a key's default)
      return typeof choices[0] === "number" ? Number(el.value) : el.value;
    }
    default:
      return el.value;
  }
}

/** The breakdown rows as CSV (header + one line per row, RFC 4180 quoting). */
export function rowsToCsv(rows, columns = CSV_COLUMNS) {
  const cell = (v) => {
    const s = v === null || v === undefined ? "" : String(v);
    return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  };
  return [columns.join(","), ...rows.map((r) => columns.map((c) => cell(r[c])).join(","))].join("\n") + "\n";
}

function h(doc, tag, attrs = {}, children = []) {
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
function fillSelect(doc, select, values, labels = {}) {
  select.replaceChildren(
    ...values.map((v) =>
      h(doc, "option", { value: v === null ? "" : String(v), text: labels[String(v)] ?? String(v) }),
    ),
  );
}

/** Build every control from `options`; returns {root, controls: Map key -> {ctl, el, wrap, out}}. */
export function createControls(doc, options) {
  const root = h(doc, "div", { class: "memsim-controls" });
  const controls = new Map();
  const groups = new Map();
  const listId = `memsim-presets-${++uid}`;
  for (const ctl of CONTROLS) {
    if (!groups.has(ctl.group)) {
      const fs = h(doc, "fieldset", { class: `memsim-group memsim-group-${ctl.group.toLowerCase()}` }, [
        h(doc, "legend", { text: ctl.group }),
      ]);
      groups.set(ctl.group, fs);
      root.append(fs);
    }
    const cls = `memsim-ctl ${ctlClass(ctl.key)}`;
    let el;
    let out = null;
    if (ctl.kind === "model") {
      el = h(doc, "input", { type: "text", list: listId, class: cls, spellcheck: "false" });
      const list = h(doc, "datalist", { id: listId, class: "memsim-presets" });
      const presets = (options.presets ?? []).map((p) => h(doc, "option", { value: p.id, label: p.label }));
      list.replaceChildren(...presets, h(doc, "option", { value: "custom", label: "custom llama-style dimensions" }));
      groups.get(ctl.group).append(list);
    } else if (ctl.kind === "gpu") {
      el = h(doc, "select", { class: cls });
      const ids = [...(options.gpus ?? []).map((g) => g.id), "custom"];
      const labels = Object.fromEntries((options.gpus ?? []).map((g) => [g.id, `${g.name}`]));
      fillSelect(doc, el, ids, { ...labels, custom: "custom memory size" });
    } else if (ctl.kind === "select") {
      el = h(doc, "select", { class: cls });
      fillSelect(doc, el, options.choices?.[ctl.key] ?? [], options.choice_labels?.[ctl.key]);
    } else if (ctl.kind === "bool") {
      el = h(doc, "input", { type: "checkbox", class: cls });
    } else if (ctl.kind === "log") {
      const stops = options.stops?.[ctl.key] ?? [1];
      el = h(doc, "input", { type: "range", min: "0", max: String(stops.length - 1), step: "1", class: cls });
      out = h(doc, "output", { class: "memsim-value" });
    } else if (ctl.kind === "headroom") {
      el = h(doc, "input", { type: "range", min: "0", max: "50", step: "1", class: cls });
      out = h(doc, "output", { class: "memsim-value" });
    } else if (ctl.kind === "targets") {
      el = h(doc, "div", { class: `${cls} memsim-targets`, role: "group" });
    } else {
      el = h(doc, "input", { type: "number", class: cls, min: ctl.kind === "number" ? "0" : "1",
        step: ctl.kind === "number" ? "any" : "1" });
    }
    const label = h(doc, "span", { class: "memsim-label", text: ctl.label });
    const wrap = h(doc, "label", { class: `memsim-field memsim-field-${ctl.kind}` }, [label, el]);
    if (out) wrap.append(out);
    groups.get(ctl.group).append(wrap);
    controls.set(ctl.key, { ctl, el, wrap, out });
  }
  return { root, controls };
}

function syncTargets(doc, el, scenario, options) {
  const chosen = getPath(scenario, "lora.targets") ?? [];
  const names = [...new Set([...(options.lora_targets ?? []), ...chosen])];
  const have = [...el.querySelectorAll("input")].map((i) => i.value).join("|");
  if (have !== names.join("|")) {
    el.replaceChildren(
      ...names.map((n) =>
        h(doc, "label", { class: "memsim-target" }, [h(doc, "input", { type: "checkbox", value: n }), ` ${n}`]),
      ),
    );
  }
  for (const box of el.querySelectorAll("input")) box.checked = chosen.includes(box.value);
}

/** Put scenario values, headroom, disabled state and the error mark onto the controls. */
export function syncControls(doc, controls, scenario, options, headroom = 0.1, errorField = "") {
  const disabled = options.disabled ?? {};
  const disabledValues = options.disabled_values ?? {};
  const bad = controlForField(errorField);
  for (const [key, { ctl, el, wrap, out }] of controls) {
    let value = key === "headroom" ? headroom : getPath(scenario, key);
    switch (ctl.kind) {
      case "model":
        el.value = value && typeof value === "object" ? "custom" : (value ?? "");
        break;
      case "dim":
        if (value === undefined) value = options.model_dims?.[key.split(".")[1]];
        el.value = value ?? "";
        break;
      case "gpu":
        el.value = scenario.gpu && typeof scenario.gpu === "object" ? "custom" : (scenario.gpu ?? "");
        break;
      case "bool":
        el.checked = Boolean(value);
        break;
      case "log": {
        const stops = options.stops?.[key] ?? [];
        el.value = String(logIndex(stops, value ?? stops[0]));
        out.textContent = String(value ?? "");
        break;
      }
      case "headroom":
        el.value = String(Math.round(headroom * 100));
        out.textContent = `${Math.round(headroom * 100)}%`;
        break;
      case "targets":
        syncTargets(doc, el, scenario, options);
        break;
      default:
        if (key === "gpu.memory_gib" && value === undefined) {
          value = (options.gpus ?? []).find((g) => g.id === scenario.gpu)?.memory_gib;
        }
        el.value = value === undefined || value === null ? "" : String(value);
    }
    const reason = disabled[key];
    const off = Boolean(reason);
    if (ctl.kind === "targets") {
      for (const box of el.querySelectorAll("input")) box.disabled = off;
      el.setAttribute("aria-disabled", String(off));
    } else {
      el.disabled = off;
    }
    wrap.classList.toggle("memsim-disabled", off);
    wrap.title = reason ?? "";
    if (el.tagName === "SELECT") {
      const blocked = (disabledValues[key] ?? []).map(String);
      for (const opt of el.options) opt.disabled = blocked.includes(opt.value);
    }
    const invalid = key === bad;
    wrap.classList.toggle("memsim-invalid", invalid);
    if (ctl.kind !== "targets") el.setAttribute("aria-invalid", String(invalid));
  }
}

/** Fill the verdict panel from `result` (verdict, peaks with their counters, bottleneck, scaling summary). */
export function renderVerdict(doc, el, result) {
  if (!result || !result.verdict) {
    el.replaceChildren();
    return;
  }
  const v = result.verdict;
  const total = result.peaks?.[0];
  const head = h(doc, "div", { class: "memsim-verdict-head" }, [
    h(doc, "span", { class: "memsim-verdict-word", text: v }),
    h(doc, "span", {
      class: "memsim-verdict-peak",
      text: ` peak ${total ? total.size : "?"} (${total ? total.label : ""}) at ${result.peak_moment} on ` +
        `${result.peak_rank}; ${result.gpu?.name} holds ${result.gpu?.memory_gib} GiB, ` +
        `${Math.round(result.headroom * 100)}% headroom leaves ${fmtBytes(result.usable_bytes)}`,
    }),
  ]);
  const peaks = h(
    doc,
    "ul",
    { class: "memsim-peaks" },
    (result.peaks ?? []).map((p) =>
      h(doc, "li", { class: `memsim-peak memsim-peak-${p.label}` }, [
        h(doc, "b", { text: `${p.label} ${p.size}` }),
        ` predicts ${p.counter}`,
      ]),
    ),
  );
  const extra = [h(doc, "div", { class: "memsim-bottleneck", text: result.bottleneck?.text ?? "" })];
  for (const c of result.caveats ?? []) extra.push(h(doc, "div", { class: "memsim-caveat", text: `caveat: ${c}` }));
  const s = result.scaling ?? {};
  const parts = [];
  if (s.micro_batch_size) {
    parts.push(`largest micro-batch that fits: ${s.micro_batch_size.max_fit ?? "none"}` +
      (s.micro_batch_size.exceeds_at !== null && s.micro_batch_size.exceeds_at !== undefined
        ? ` (exceeds the GPU at ≈${s.micro_batch_size.exceeds_at})` : ""));
  }
  if (s.seq_len?.fixed) parts.push(`sequence fixed at ${s.seq_len.fixed}`);
  else if (s.seq_len) parts.push(`longest sequence that fits: ${s.seq_len.max_fit ?? "none"}`);
  if (parts.length) extra.push(h(doc, "div", { class: "memsim-scaling-summary", text: parts.join("; ") }));
  el.className = `memsim-verdict memsim-verdict-${v.replace(/ /g, "-")}`;
  el.replaceChildren(head, peaks, ...extra);
}

/** The breakdown rows as an HTML table (rank, moment, category, item, size, counter, formula). */
export function buildTable(doc, rows) {
  const cols = [["rank", "rank"], ["moment", "moment"], ["category", "category"], ["item", "item"],
    ["size", "size"], ["counter", "counted by"], ["formula", "formula"]];
  const thead = h(doc, "thead", {}, [h(doc, "tr", {}, cols.map(([, t]) => h(doc, "th", { text: t })))]);
  const body = h(doc, "tbody");
  for (const r of rows ?? []) {
    const tr = h(doc, "tr", { class: `memsim-row memsim-cat-${r.category}` });
    for (const [c] of cols) {
      const text = c === "size" ? fmtBytes(r.bytes) : String(r[c] ?? "");
      tr.append(h(doc, "td", { class: `memsim-col-${c}`, text }));
    }
    body.append(tr);
  }
  return h(doc, "table", { class: "memsim-table" }, [thead, body]);
}

const TRACE_HINT = "Trace two training steps of this scenario on fake tensors (CPU, nothing allocated) " +
  "and compare the measured live tensor bytes with the simulation";

/** A signed percentage with two decimals (`+1.25%`); `n/a` when there is none. */
export function fmtPct(x) {
  if (x === null || x === undefined || Number.isNaN(x)) return "n/a";
  return `${x > 0 ? "+" : ""}${Number(x).toFixed(2)}%`;
}

/** One line for a running trace: stage (until the tracker runs), step and phase, ops, bytes, elapsed time. */
export function traceProgressText(p = {}) {
  const parts = [];
  if (p.step === undefined) {
    parts.push(p.stage ?? "starting");
  } else {
    parts.push(p.step >= 1 ? `step ${p.step}/${p.steps ?? 2}: ${p.phase ?? ""}` : String(p.phase ?? p.stage));
    parts.push(`${Number(p.ops ?? 0).toLocaleString("en-US")} ops`);
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
  const cols = [["category", "category"], ["traced", "traced"], ["simulated", "simulated"], ["error", "error"]];
  const thead = h(doc, "thead", {}, [h(doc, "tr", {}, cols.map(([, t]) => h(doc, "th", { text: t })))]);
  const body = h(doc, "tbody");
  for (const c of categories ?? []) {
    body.append(h(doc, "tr", { class: `memsim-trace-row memsim-cat-${c.category}` }, [
      h(doc, "td", { class: "memsim-col-category", text: c.category }),
      h(doc, "td", { class: "memsim-col-size", text: fmtBytes(c.traced) }),
      h(doc, "td", { class: "memsim-col-size", text: fmtBytes(c.simulated) }),
      h(doc, "td", { class: `memsim-col-error ${errorClass(c.error_pct)}`, text: fmtPct(c.error_pct) }),
    ]));
  }
  return h(doc, "table", { class: "memsim-table memsim-trace-table" }, [thead, body]);
}

/** Draw the trace panel from the `trace` trait (state, availability, progress, staleness) and `trace_view`. */
export function renderTrace(doc, panel, trace = {}, view = {}) {
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

  const p = trace.progress ?? {};
  let status = "";
  if (running) status = trace.running_stale ? "tracing the scenario as it was when you clicked" : "tracing…";
  else if (cancelling) status = "cancelling…";
  else if (state === "done") status = `traced in ${Number(p.elapsed_s ?? 0).toFixed(1)} s (${Number(p.ops ?? 0).toLocaleString("en-US")} ops)`;
  else if (state === "error") status = `trace failed: ${trace.error ?? ""}`;
  else if (state === "cancelled") status = "trace cancelled";
  panel.status.textContent = status;
  panel.status.className = `memsim-trace-status memsim-trace-status-${state}`;
  panel.progress.hidden = !(running || cancelling);
  if (typeof p.fraction === "number") panel.bar.value = p.fraction;
  else panel.bar.removeAttribute("value"); // indeterminate until step 2 gives a measure
  panel.progressText.textContent = running || cancelling ? traceProgressText(p) : "";

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
  if (!summary) {
    panel.headline.replaceChildren();
    panel.tableHolder.replaceChildren();
    panel.notes.replaceChildren();
    panel.notes.hidden = true;
    return;
  }
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
  panel.tableHolder.replaceChildren(traceTable(doc, summary.categories));
  const notes = summary.notes ?? [];
  panel.notes.hidden = notes.length === 0;
  panel.notes.replaceChildren(
    h(doc, "summary", { text: `trace notes (${notes.length})` }),
    h(doc, "ul", {}, notes.map((n) => h(doc, "li", { text: n }))),
  );
}

/** The traced rank of a multi-GPU job in words, and the simulated stage it is held to (nothing for 1 GPU). */
export function rankLine(doc, rank) {
  if (!rank || Number(rank.world_size ?? 1) <= 1) return [];
  const sim = rank.simulated_role ? ` (simulated: ${rank.simulated_role})` : "";
  return [h(doc, "div", { class: "memsim-trace-rank", text: `traced ${rank.role || `rank ${rank.index}`}${sim}` })];
}

/** GiB with two decimals (`12.34 GiB`): how "Make it fit" states the memory a change saves. */
export function fmtGiB(gib) {
  return `${Number(gib ?? 0).toFixed(2)} GiB`;
}

/** Keys of a candidate layout row and where the scenario keeps them (to mark the layout in use). */
const LAYOUT_KEYS = [
  ["dp", "parallel.dp"], ["tp", "parallel.tp"], ["pp", "parallel.pp"], ["cp", "parallel.cp"], ["ep", "parallel.ep"],
  ["zero", "parallel.zero"], ["sequence_parallel", "parallel.sequence_parallel"], ["offload", "parallel.offload"],
  ["micro_batch_size", "micro_batch_size"], ["grad_accum_steps", "grad_accum_steps"],
  ["activation_checkpointing", "activation_checkpointing"], ["loss", "loss"], ["optimizer", "optimizer"],
];

/** True when the scenario already uses a candidate layout row (every searched key equal). */
export function isCurrentLayout(row, scenario) {
  return LAYOUT_KEYS.every(([k, path]) => getPath(scenario ?? {}, path) === row[k]);
}

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

  const run = h(doc, "button", {
    type: "button", class: "memsim-layouts-run", text: "Search layouts",
    title: "Try every dp/tp/pp/cp layout and memory knob on this GPU type and rank what fits (throughput proxy)",
  });
  const gpus = h(doc, "input", { type: "number", class: "memsim-layouts-gpus", min: "1", step: "1",
    "aria-label": "GPUs to search" });
  const layoutStatus = h(doc, "span", { class: "memsim-layouts-status", role: "status" });
  const layoutError = h(doc, "div", { class: "memsim-layouts-error", role: "alert", hidden: "" });
  const layoutStale = h(doc, "div", { class: "memsim-layouts-stale-label", hidden: "" });
  const summary = h(doc, "div", { class: "memsim-layouts-summary" });
  const table = h(doc, "div", { class: "memsim-layouts-table-holder" });
  const chart = h(doc, "div", { class: "memsim-chart memsim-chart-candidates" });
  const layoutResult = h(doc, "div", { class: "memsim-layouts-result", hidden: "" }, [layoutStale, summary, table, chart]);
  const layouts = h(doc, "div", { class: "memsim-layouts" }, [
    h(doc, "div", { class: "memsim-layouts-bar" }, [
      h(doc, "b", { text: "Layouts" }), run, h(doc, "span", { text: "on" }), gpus, h(doc, "span", { text: "GPUs" }),
      layoutStatus,
    ]),
    layoutError, layoutResult,
  ]);
  const body = h(doc, "div", { class: "memsim-fit-body", hidden: "" }, [error, result, layouts]);
  const root = h(doc, "section", { class: "memsim-fit" }, [
    h(doc, "div", { class: "memsim-fit-bar" }, [toggle, status]), body,
  ]);
  return {
    root, toggle, status, body, error, result, stale, headline, list, facts, levers,
    layouts: { root: layouts, run, gpus, status: layoutStatus, error: layoutError, result: layoutResult,
      stale: layoutStale, summary, table, charts: { candidates: chart } },
  };
}

function applyButton(doc, attrs, enabled, text = "Apply") {
  const b = h(doc, "button", { type: "button", ...attrs, text });
  b.disabled = !enabled;
  return b;
}

function changesTable(doc, items, kind, enabled) {
  const cols = ["change", "saves", "then", "fits", "cost", ""];
  const thead = h(doc, "thead", {}, [h(doc, "tr", {}, cols.map((t) => h(doc, "th", { text: t })))]);
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
  return h(doc, "table", { class: `memsim-table memsim-fit-table memsim-fit-table-${kind}` }, [thead, body]);
}

function fact(doc, text, kind, enabled) {
  const li = h(doc, "li", { class: `memsim-fit-fact memsim-fit-fact-${kind || "note"}` }, [text]);
  if (kind) li.append(" ", applyButton(doc, { class: "memsim-fit-apply", "data-apply": kind, "data-index": "0" }, enabled));
  return li;
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
  const facts = [];
  const mg = v.min_gpus;
  if (v.fits) {
    panel.headline.replaceChildren(h(doc, "b", { class: "memsim-fit-word", text: "fits" }),
      `: ${need}, ${fmtBytes(v.spare_bytes)} to spare. How far it goes:`);
    panel.list.replaceChildren();
    if (v.max_micro_batch !== null && v.max_micro_batch !== undefined) {
      facts.push(fact(doc, `largest micro-batch that fits: ${v.max_micro_batch} (now ${v.micro_batch_size})`,
        "max_micro_batch", enabled && v.max_micro_batch !== v.micro_batch_size));
    }
    if (v.max_seq_len !== null && v.max_seq_len !== undefined) {
      facts.push(fact(doc, `longest sequence that fits: ${v.max_seq_len} (now ${v.seq_len})`, "max_seq_len",
        enabled && v.max_seq_len !== v.seq_len));
    }
  } else {
    const changes = v.changes ?? [];
    panel.headline.replaceChildren(h(doc, "b", { class: "memsim-fit-word", text: v.verdict }), `: ${need}. ` +
      (changes.length ? "Smallest changes that fit:" : "No combination of up to three changes fits."));
    panel.list.replaceChildren(...(changes.length ? [changesTable(doc, changes, "change", enabled)] : []));
    const first = v.with_first_fix;
    if (first && first.max_micro_batch) {
      facts.push(fact(doc, `with “${first.change}”, micro-batches up to ${first.max_micro_batch} fit`, "", false));
    }
  }
  if (mg) {
    facts.push(fact(doc, `fewest GPUs that fit, layout kept: ${mg.num_gpus} (dp=${mg.dp}, ZeRO-${mg.zero}; ` +
      `${fmtBytes(mg.device_total_bytes)} per GPU; now ${v.num_gpus})`, "min_gpus", enabled && mg.num_gpus !== v.num_gpus));
  } else {
    facts.push(fact(doc, "more GPUs alone do not make it fit (data parallelism with ZeRO-3 up to 4096)", "", false));
  }
  panel.facts.replaceChildren(...facts);
  const levers = v.levers ?? [];
  const leverTable = levers.length ? changesTable(doc, levers, "lever", enabled) : h(doc, "span", { text: "none applies" });
  if (v.fits) {
    panel.levers.replaceChildren(h(doc, "div", { class: "memsim-fit-subhead", text: "What each single change would save:" }),
      leverTable);
  } else {
    panel.levers.replaceChildren(h(doc, "details", { class: "memsim-fit-levers-all" }, [
      h(doc, "summary", { text: `each single change alone (${levers.length})` }), leverTable,
    ]));
  }
}

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

/** Draw the "Layouts" part from the `layouts` trait; `scenario` marks the layout already in use. */
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
  const counts = (v.gpu_counts ?? []).join(", ");
  panel.summary.textContent = `${Number(v.evaluated ?? 0).toLocaleString("en-US")} candidates for ${v.model} on ` +
    `${counts} × ${v.gpu}: ${Number(v.fitting ?? 0).toLocaleString("en-US")} fit` +
    (typeof layouts.ms === "number" ? ` (searched in ${layouts.ms.toFixed(0)} ms)` : "") +
    (v.fitting ? ". Best by modelled tokens/s per GPU:" : ". Nothing fits: try more GPUs, or a change above.");
  const rows = v.top ?? [];
  if (!rows.length) {
    panel.table.replaceChildren();
    return;
  }
  const cols = ["#", "layout", "micro-batch", "knobs", "memory", "tokens/s/GPU", ""];
  const thead = h(doc, "thead", {}, [h(doc, "tr", {}, cols.map((t) => h(doc, "th", { text: t })))]);
  const body = h(doc, "tbody");
  const ok = state !== "running" && !stale;
  for (const r of rows) {
    const current = isCurrentLayout(r, scenario);
    body.append(h(doc, "tr", { class: `memsim-layout-row${current ? " memsim-layout-current" : ""}` }, [
      h(doc, "td", { text: String(r.rank) }),
      h(doc, "td", { class: "memsim-col-layout", text: layoutText(r) }),
      h(doc, "td", { class: "memsim-col-mb", text: `${r.micro_batch_size} × ${r.grad_accum_steps}`,
        title: "micro-batch × gradient accumulation steps" }),
      h(doc, "td", { class: "memsim-col-knobs", text: knobsText(r) }),
      h(doc, "td", { class: "memsim-col-size", text: fmtBytes(r.device_total_bytes) }),
      h(doc, "td", { class: "memsim-col-size", text: Number(r.tokens_per_gpu_s).toLocaleString("en-US", { maximumFractionDigits: 0 }) }),
      h(doc, "td", {}, [applyButton(doc, { class: "memsim-layout-apply", "data-candidate": String(r.candidate),
        title: current ? "the scenario uses this layout" : "Set the scenario to this layout" }, ok && !current,
      current ? "current" : "Apply")]),
    ]));
  }
  panel.table.replaceChildren(h(doc, "table", { class: "memsim-table memsim-layouts-table" }, [thead, body]));
}

/** A User Timing mark `memsim:<name>`, the page's first only (the first widget's render, bundle import and
 * each chart's first embed): DevTools' timeline and benchmarks/first_chart.py read them. */
// ----- compare: pinned scenarios beside the current one -------------------------------------------------------
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

/** Draw the compare panel from the `comparison` trait; "Pin" is off at the limit and while the input is rejected. */
export function renderCompare(doc, panel, comparison = {}, rejected = false) {
  const pins = comparison.pins ?? [];
  const max = comparison.max_pins ?? 3;
  panel.pin.disabled = rejected || pins.length >= max;
  panel.status.textContent = rejected ? "the input shown is rejected: fix it to pin it"
    : pins.length >= max ? `${max} pinned: remove one to pin another`
      : pins.length ? `${pins.length} of ${max} pinned; change a knob to compare` : PIN_HINT;
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

/** Wire the compare panel into `render`: "Pin" and remove write `pins`, Python answers with `comparison`.
 * Returns the cleanup of its chart. */
function wireCompare(doc, model, panel, { listen, onModel, bundle }) {
  const show = () => renderCompare(doc, panel, readTrait(model, "comparison") ?? {}, Boolean(model.get("error")));
  const draw = chartDrawer(doc, panel.charts, () => {
    const chart = readTrait(model, "comparison")?.view?.chart;
    return chart ? { compare: chart } : {};
  }, bundle);
  const write = (pins) => {
    model.set("pins", pins);
    model.save_changes();
  };
  listen(panel.pin, "click", () => {
    if (!panel.pin.disabled) write(withPin(model.get("pins"), model.get("scenario_data")));
  });
  listen(panel.pins, "click", (event) => {
    const button = event.target?.closest?.("button[data-unpin]");
    if (button) write(withoutPin(model.get("pins"), Number(button.getAttribute("data-unpin"))));
  });
  onModel("comparison", () => {
    show();
    draw();
  });
  onModel("error", show);
  onModel("_vega_js", () => {
    draw.forget();
    draw();
  });
  show();
  draw();
  return () => draw.dispose();
}

function mark(name) {
  const perf = globalThis.performance;
  if (typeof perf?.mark !== "function" || perf.getEntriesByName?.(`memsim:${name}`).length) return;
  perf.mark(`memsim:${name}`);
}

/** Draws named Vega-Lite specs into elements, one per frame, skipping unchanged ones. Returns `draw()`,
 * with `draw.views` (name -> vega view), `draw.forget()` (redraw all next time) and `draw.dispose()`. */
function chartDrawer(doc, els, getSpecs, getBundle) {
  let token = 0;
  const views = {};
  const finalizers = {};
  const drawn = {};
  const drop = (name) => {
    finalizers[name]?.();
    delete finalizers[name];
    delete views[name];
    delete drawn[name];
  };
  const draw = async () => {
    const mine = ++token;
    const specs = getSpecs() ?? {};
    let embed;
    try {
      embed = await deps.loadVegaEmbed(getBundle());
      if (embed) mark("vega-loaded");
    } catch (err) {
      for (const name of Object.keys(els)) els[name].textContent = `charts unavailable: ${err.message}`;
      return;
    }
    if (mine !== token) return;
    for (const name of Object.keys(els)) {
      const spec = specs[name];
      if (!embed || !spec) {
        if (!spec) drop(name);
        else delete drawn[name];
        els[name].textContent = embed || !spec ? "" : "charts need vl-convert-python in the kernel";
        continue;
      }
      const text = JSON.stringify(spec);
      if (drawn[name] === text && views[name]) continue; // unchanged: keep the drawn view
      await afterPaint(doc.defaultView);
      if (mine !== token) return;
      try {
        const res = await embed(els[name], structuredClone(spec), { actions: false, renderer: "svg" });
        if (mine !== token) {
          res.finalize?.();
          return;
        }
        finalizers[name]?.();
        views[name] = res.view;
        finalizers[name] = () => res.finalize?.();
        drawn[name] = text;
        mark(`drawn-${name}`);
      } catch (err) {
        els[name].textContent = `chart error: ${err.message}`;
        delete drawn[name];
      }
    }
  };
  draw.views = views;
  draw.forget = () => {
    for (const name of Object.keys(drawn)) delete drawn[name];
  };
  draw.dispose = () => {
    token++;
    for (const name of Object.keys(finalizers)) finalizers[name]?.();
  };
  return draw;
}

/** Resolve once the browser has painted (next frame, then a task); right away where no frames run (node).
 * Hidden tabs run no frames, so a timer resolves it too. */
export function afterPaint(win) {
  return new Promise((resolve) => {
    let done = false;
    const go = () => {
      if (!done) {
        done = true;
        setTimeout(resolve, 0);
      }
    };
    if (typeof win?.requestAnimationFrame === "function") {
      win.requestAnimationFrame(go);
      setTimeout(go, 50);
    } else {
      go();
    }
  });
}

const bundles = new Map();

async function importText(src) {
  if (typeof Blob !== "undefined" && typeof URL?.createObjectURL === "function") {
    const url = URL.createObjectURL(new Blob([src], { type: "text/javascript" }));
    try {
      return await import(/* webpackIgnore: true */ url);
    } catch {
      // runtimes without blob: module URLs (node): fall through to a data: URL
    } finally {
      URL.revokeObjectURL(url);
    }
  }
  return import(/* webpackIgnore: true */ "data:text/javascript;charset=utf-8," + encodeURIComponent(src));
}

/** Import an ES module given as source text (a blob: URL, else a data: URL); cached per source text. */
export function importFromSource(src) {
  if (!bundles.has(src)) bundles.set(src, importText(src));
  return bundles.get(src);
}

/** Dependencies tests can replace: how vega-embed is obtained from the `_vega_js` bundle. */
export const deps = {
  async loadVegaEmbed(src) {
    if (!src) return null;
    const mod = await importFromSource(src);
    return mod.vegaEmbed ?? mod.default ?? null;
  },
};

function download(doc, href, name) {
  const a = h(doc, "a", { href, download: name });
  doc.body.append(a);
  a.click();
  a.remove();
}

/** The launch-config export: a format dropdown, an "Export" button and a status line (memsim_widget.export). */
export function createExportPanel(doc) {
  const select = h(doc, "select", { class: "memsim-export-format", "aria-label": "launch config format" });
  const button = h(doc, "button", { type: "button", class: "memsim-export-config", text: "Export" });
  const status = h(doc, "span", { class: "memsim-export-status", role: "status" });
  const root = h(doc, "details", { class: "memsim-details-export" }, [
    h(doc, "summary", { text: "launch config" }), select, button, status,
  ]);
  return { root, select, button, status };
}

/** Show the `export` trait: the formats Python offers (the panel hides without any), the files or the error. */
export function renderExport(doc, panel, state = {}) {
  const formats = state.formats ?? [];
  if ([...panel.select.options].map((o) => o.value).join() !== formats.join()) fillSelect(doc, panel.select, formats);
  panel.root.hidden = formats.length === 0;
  const names = Object.keys(state.files ?? {});
  panel.status.textContent = state.error || (names.length ? `downloaded ${names.join(", ")}` : "");
  panel.status.classList.toggle("memsim-export-error", Boolean(state.error));
}

/** One text Blob per exported file, in Python's order. */
export function exportBlobs(files = {}) {
  return Object.entries(files).map(([name, text]) => ({ name, blob: new Blob([text], { type: "text/plain;charset=utf-8" }) }));
}

/** Wire the panel: a click asks Python for the files; the answer to that request is downloaded once. */
function wireExport(doc, model, panel, listen, onModel) {
  let asked = null; // the trait's id when the request left: a larger id is its answer
  const show = () => renderExport(doc, panel, model.get("export") ?? {});
  listen(panel.button, "click", () => {
    asked = model.get("export")?.id ?? 0;
    model.send({ type: "export", format: panel.select.value });
  });
  onModel("export", () => {
    show();
    const state = model.get("export") ?? {};
    if (asked === null || !(state.id > asked)) return;
    asked = null;
    for (const { name, blob } of exportBlobs(state.files)) {
      const url = URL.createObjectURL(blob);
      download(doc, url, name);
      setTimeout(() => URL.revokeObjectURL(url), 1000);
    }
  });
  show();
}

/** anywidget entry point: draw the widget into `el`; returns the cleanup function. */
export function render({ model, el }) {
  mark("render");
  const doc = el.ownerDocument;
  const disposers = [];
  const listen = (target, type, fn) => {
    target.addEventListener(type, fn);
    disposers.push(() => target.removeEventListener(type, fn));
  };
  const onModel = (name, fn) => {
    model.on(`change:${name}`, fn);
    disposers.push(() => model.off(`change:${name}`, fn));
  };

  let options = readTrait(model, "options") ?? {};
  let { root: controlsEl, controls } = createControls(doc, options);
  const errorEl = h(doc, "div", { class: "memsim-error", role: "alert", hidden: "" });
  const verdictEl = h(doc, "div", { class: "memsim-verdict" });
  const chartEls = {};
  // "phases": the rollout and training phases of an RL objective (absent for SFT: its block hides)
  const chartBlocks = ["breakdown", "scaling", "time", "phases"].map((name) => {
    chartEls[name] = h(doc, "div", { class: `memsim-chart memsim-chart-${name}` });
    const png = h(doc, "button", { type: "button", class: `memsim-export memsim-png-${name}`, text: "PNG" });
    const svg = h(doc, "button", { type: "button", class: `memsim-export memsim-svg-${name}`, text: "SVG" });
    for (const [btn, fmt] of [[png, "png"], [svg, "svg"]]) {
      listen(btn, "click", async () => {
        const view = drawCharts.views[name];
        if (!view) return;
        const url = await view.toImageURL(fmt, fmt === "png" ? 2 : 1);
        download(doc, url, `memsim-${name}.${fmt}`);
      });
    }
    return h(doc, "div", { class: `memsim-chart-block memsim-block-${name}` }, [chartEls[name], h(doc, "div", { class: "memsim-tools" }, [png, svg])]);
  });
  const showPhases = () => {
    chartBlocks[3].hidden = !readTrait(model, "charts")?.phases;
  };
  const trace = createTracePanel(doc);
  const fit = createFitPanel(doc);
  const compare = createComparePanel(doc);
  const exportPanel = createExportPanel(doc);
  const tableHolder = h(doc, "div", { class: "memsim-table-holder" });
  const csvLink = h(doc, "a", { class: "memsim-csv", download: "memsim-breakdown.csv", text: "download CSV" });
  const jsonArea = h(doc, "textarea", { class: "memsim-json", rows: "14", spellcheck: "false" });
  const copyBtn = h(doc, "button", { type: "button", class: "memsim-copy", text: "copy" });
  const applyBtn = h(doc, "button", { type: "button", class: "memsim-apply", text: "apply JSON" });
  const output = h(doc, "div", { class: "memsim-output" }, [
    errorEl,
    verdictEl,
    fit.root,
    compare.root,
    ...chartBlocks,
    trace.root,
    h(doc, "details", { class: "memsim-details-table" }, [h(doc, "summary", { text: "breakdown table" }), csvLink, tableHolder]),
    h(doc, "details", { class: "memsim-details-json" }, [
      h(doc, "summary", { text: "scenario JSON" }), jsonArea, h(doc, "div", { class: "memsim-tools" }, [copyBtn, applyBtn]),
    ]),
    exportPanel.root,
  ]);
  const root = h(doc, "div", { class: "memsim" }, [controlsEl, output]);
  el.replaceChildren(root);

  const commit = (key, value) => {
    if (key === "headroom") {
      model.set("headroom", value);
    } else {
      model.set("scenario_data", applyControl(model.get("scenario_data") ?? {}, key, value, options));
    }
    model.save_changes();
  };

  const wireControls = () => {
    for (const [key, { ctl, el: input, out }] of controls) {
      if (ctl.kind === "targets") {
        listen(input, "change", () => {
          const chosen = [...input.querySelectorAll("input")].filter((b) => b.checked).map((b) => b.value);
          commit(key, chosen);
        });
        continue;
      }
      if (ctl.kind === "log" || ctl.kind === "headroom") {
        listen(input, "input", () => {
          out.textContent = ctl.kind === "log" ? String(readControl(ctl, input, options)) : `${input.value}%`;
        });
      }
      listen(input, "change", () => {
        const value = ctl.kind === "headroom" ? Number(input.value) / 100 : readControl(ctl, input, options);
        if (typeof value === "number" && Number.isNaN(value)) return;
        commit(key, value);
      });
    }
  };

  const syncAll = () => {
    syncControls(doc, controls, model.get("scenario_data") ?? {}, options, model.get("headroom") ?? 0.1,
      model.get("error_field") ?? "");
    if (doc.activeElement !== jsonArea) jsonArea.value = JSON.stringify(model.get("scenario_data") ?? {}, null, 2);
  };
  const showError = () => {
    const msg = model.get("error") ?? "";
    errorEl.textContent = msg ? `${msg}. Showing the last valid result.` : "";
    errorEl.hidden = !msg;
    output.classList.toggle("memsim-stale", Boolean(msg));
    syncAll();
  };
  const showResult = () => {
    const result = readTrait(model, "result") ?? {};
    renderVerdict(doc, verdictEl, result);
    tableHolder.replaceChildren(buildTable(doc, result.rows ?? []));
    csvLink.href = "data:text/csv;charset=utf-8," + encodeURIComponent(rowsToCsv(result.rows ?? []));
  };
  // Charts draw after the verdict and table are painted, one per frame: embedding a chart takes tens of
  // milliseconds (the scaling view over a hundred), and the new result should not wait for it on screen.
  const bundle = () => model.get("_vega_js") ?? "";
  const drawCharts = chartDrawer(doc, chartEls, () => readTrait(model, "charts"), bundle);
  const drawTraceCharts = chartDrawer(doc, trace.charts, () => readTrait(model, "trace_view")?.charts, bundle);
  const drawLayoutCharts = chartDrawer(doc, fit.layouts.charts, () => {
    const chart = readTrait(model, "layouts")?.view?.chart;
    return chart ? { candidates: chart } : {};
  }, bundle);
  disposers.push(() => {
    drawCharts.dispose();
    drawTraceCharts.dispose();
    drawLayoutCharts.dispose();
  });
  disposers.push(wireCompare(doc, model, compare, { listen, onModel, bundle }));
  const showFit = () => renderFit(doc, fit, model.get("fit_open"), readTrait(model, "fit") ?? {});
  const showLayouts = () => renderLayouts(doc, fit.layouts, readTrait(model, "layouts") ?? {},
    model.get("scenario_data") ?? {});
  listen(fit.toggle, "click", () => {
    model.set("fit_open", !model.get("fit_open"));
    model.save_changes();
  });
  // One listener for every "Apply" button (they are redrawn with each result): Python applies the entry of
  // the result it showed (`id`), through the same path as an edit.
  listen(fit.root, "click", (event) => {
    const button = event.target?.closest?.("button[data-apply], button[data-candidate]");
    if (!button || button.disabled) return;
    if (button.hasAttribute("data-apply")) {
      model.send({ type: "fit_apply", kind: button.getAttribute("data-apply"),
        index: Number(button.getAttribute("data-index")), id: readTrait(model, "fit")?.id });
    } else {
      model.send({ type: "layout_apply", candidate: Number(button.getAttribute("data-candidate")),
        id: readTrait(model, "layouts")?.id });
    }
    button.disabled = true;
    button.textContent = "Applying…";
  });
  listen(fit.layouts.run, "click", () => {
    const n = Number.parseInt(fit.layouts.gpus.value, 10);
    model.send({ type: "layouts", gpus: Number.isFinite(n) && n > 0 ? n : null });
  });
  const showTrace = () => renderTrace(doc, trace, model.get("trace") ?? {}, readTrait(model, "trace_view") ?? {});
  listen(trace.button, "click", () => {
    // While a trace runs the button cancels it. Python ignores requests it cannot serve anyway.
    if (trace.button.disabled) return;
    model.send({ type: model.get("trace")?.state === "running" ? "cancel" : "verify" });
  });

  listen(copyBtn, "click", async () => {
    jsonArea.select();
    try {
      await navigator.clipboard.writeText(jsonArea.value);
    } catch {
      doc.execCommand?.("copy");
    }
  });
  listen(applyBtn, "click", () => {
    let parsed;
    try {
      parsed = JSON.parse(jsonArea.value);
    } catch (err) {
      errorEl.textContent = `scenario JSON: ${err.message}`;
      errorEl.hidden = false;
      return;
    }
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
      errorEl.textContent = "scenario JSON: must be an object ({...})";
      errorEl.hidden = false;
      return;
    }
    model.set("scenario_data", parsed);
    model.save_changes();
  });

  onModel("scenario_data", () => {
    syncAll();
    showLayouts();
  });
  onModel("fit_open", showFit);
  onModel("fit", showFit);
  onModel("layouts", () => {
    showLayouts();
    drawLayoutCharts();
  });
  onModel("headroom", syncAll);
  onModel("error", showError);
  onModel("error_field", syncAll);
  onModel("result", showResult);
  onModel("charts", () => {
    showPhases();
    drawCharts();
  });
  onModel("trace", showTrace);
  onModel("trace_view", () => {
    showTrace();
    drawTraceCharts();
  });
  onModel("_vega_js", () => {
    drawCharts.forget();
    drawTraceCharts.forget();
    drawLayoutCharts.forget();
    drawCharts();
    drawTraceCharts();
    drawLayoutCharts();
  });
  onModel("options", () => {
    const next = readTrait(model, "options") ?? {};
    const rebuild = JSON.stringify([next.presets, next.gpus, next.choices, next.stops]) !==
      JSON.stringify([options.presets, options.gpus, options.choices, options.stops]);
    options = next;
    if (rebuild) {
      // Catalogs changed (rare): rebuild the controls and their listeners.
      const fresh = createControls(doc, options);
      controlsEl.replaceWith(fresh.root);
      controlsEl = fresh.root;
      controls = fresh.controls;
      wireControls();
    }
    syncAll();
  });

  wireControls();
  wireExport(doc, model, exportPanel, listen, onModel);
  showError();
  showResult();
  showTrace();
  showFit();
  showLayouts();
  showPhases();
  drawCharts();
  drawTraceCharts();
  drawLayoutCharts();

  return () => {
    for (const dispose of disposers.splice(0)) dispose();
    el.replaceChildren();
  };
}

export default { render };
