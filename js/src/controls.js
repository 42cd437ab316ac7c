// The controls: drawn from the list Python sends (`options.controls`: key, label, kind, group), filled from
// `scenario_data`, `headroom` and `options` (disabled controls and values, the error's field), and written
// back as a new `scenario_data` (or `headroom`) when one changes.

import { fillSelect, h, nextId } from "./dom.js";
import { getPath, readTrait, setPath } from "./state.js";

/**
 * A control as Python sends it in `options.controls` (memsim_widget/widget/controls.py `CONTROLS`).
 * @typedef {object} Control
 * @property {string} key scenario key, dotted for nested keys (`parallel.tp`), or `headroom`
 * @property {string} label the text beside the input
 * @property {string} kind the input: model, dim, gpu, number, headroom, log, int, select, bool or targets
 * @property {string} group the fieldset (Model, Hardware, Batch, Training, Method, Parallel)
 */

/** Stable class name of a control: `memsim-ctl-<key>` with dots as dashes (`memsim-ctl-parallel-tp`). */
export function ctlClass(key) {
  return "memsim-ctl-" + key.replace(/\./g, "-");
}

/** Index of the largest stop <= value (0 when below every stop). */
export function logIndex(stops, value) {
  let idx = 0;
  stops.forEach((s, i) => {
    if (s <= value) idx = i;
  });
  return idx;
}

/** The control a ScenarioError field points at (`model.n_head` -> `model`; `num_gpus` -> `parallel.dp`
 * through `options.control_aliases`), among `options.controls`; null for none. */
export function controlForField(field, options = {}) {
  if (!field) return null;
  const alias = options.control_aliases?.[field];
  if (alias) return alias;
  const keys = new Set((options.controls ?? []).map((c) => c.key));
  const parts = field.split(".");
  while (parts.length) {
    const key = parts.join(".");
    if (keys.has(key)) return key;
    parts.pop();
  }
  return null;
}

function customModel(scenario, text, options) {
  if (text !== "custom") return { ...structuredClone(scenario), model: text };
  if (scenario.model && typeof scenario.model === "object") return structuredClone(scenario);
  return { ...structuredClone(scenario), model: { model_type: "llama", ...(options.model_dims ?? {}) } };
}

function customGpu(scenario, raw, options) {
  if (raw !== "custom") return { ...structuredClone(scenario), gpu: raw };
  const current = scenario.gpu;
  if (current && typeof current === "object") return structuredClone(scenario);
  const known = (options.gpus ?? []).find((g) => g.id === current);
  return { ...structuredClone(scenario), gpu: { memory_gib: known ? known.memory_gib : 80 } };
}

/** The scenario after a control moved to `raw` (already parsed for its kind); never mutates `scenario`. */
export function applyControl(scenario, key, raw, options = {}) {
  if (key === "model") return customModel(scenario, String(raw).trim(), options);
  if (key === "gpu") return customGpu(scenario, raw, options);
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

const range = (doc, cls, max) => h(doc, "input", { type: "range", min: "0", max: String(max), step: "1", class: cls });

/** One input per kind: `(doc, ctl, cls, options, listId)` -> {el, out (a value label), list (a datalist)}. */
const INPUTS = {
  model(doc, ctl, cls, options, listId) {
    const el = h(doc, "input", { type: "text", list: listId, class: cls, spellcheck: "false" });
    const list = h(doc, "datalist", { id: listId, class: "memsim-presets" });
    const presets = (options.presets ?? []).map((p) => h(doc, "option", { value: p.id, label: p.label }));
    list.replaceChildren(...presets, h(doc, "option", { value: "custom", label: "custom llama-style dimensions" }));
    return { el, list };
  },
  gpu(doc, ctl, cls, options) {
    const el = h(doc, "select", { class: cls });
    const ids = [...(options.gpus ?? []).map((g) => g.id), "custom"];
    const labels = Object.fromEntries((options.gpus ?? []).map((g) => [g.id, `${g.name}`]));
    fillSelect(doc, el, ids, { ...labels, custom: "custom memory size" });
    return { el };
  },
  select(doc, ctl, cls, options) {
    const el = h(doc, "select", { class: cls });
    fillSelect(doc, el, options.choices?.[ctl.key] ?? [], options.choice_labels?.[ctl.key]);
    return { el };
  },
  bool: (doc, ctl, cls) => ({ el: h(doc, "input", { type: "checkbox", class: cls }) }),
  log: (doc, ctl, cls, options) => ({
    el: range(doc, cls, (options.stops?.[ctl.key] ?? [1]).length - 1),
    out: h(doc, "output", { class: "memsim-value" }),
  }),
  headroom: (doc, ctl, cls) => ({ el: range(doc, cls, 50), out: h(doc, "output", { class: "memsim-value" }) }),
  targets: (doc, ctl, cls) => ({ el: h(doc, "div", { class: `${cls} memsim-targets`, role: "group" }) }),
};

/** `int`, `dim` and `number` controls (and any other kind): a number input. */
function numberInput(doc, ctl, cls) {
  const real = ctl.kind === "number";
  return { el: h(doc, "input", { type: "number", class: cls, min: real ? "0" : "1", step: real ? "any" : "1" }) };
}

function fieldset(doc, group) {
  return h(doc, "fieldset", { class: `memsim-group memsim-group-${group.toLowerCase()}` }, [
    h(doc, "legend", { text: group }),
  ]);
}

/** Build every control of `options.controls`; returns {root, controls: Map key -> {ctl, el, wrap, out}}. */
export function createControls(doc, options) {
  const root = h(doc, "div", { class: "memsim-controls" });
  const controls = new Map();
  const groups = new Map();
  const listId = nextId("memsim-presets");
  for (const ctl of options.controls ?? []) {
    if (!groups.has(ctl.group)) {
      groups.set(ctl.group, fieldset(doc, ctl.group));
      root.append(groups.get(ctl.group));
    }
    const make = INPUTS[ctl.kind] ?? numberInput;
    const { el, out = null, list } = make(doc, ctl, `memsim-ctl ${ctlClass(ctl.key)}`, options, listId);
    if (list) groups.get(ctl.group).append(list);
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

/** Show a value per kind: `(entry, value, s)` with `s` = {doc, scenario, options, headroom}. */
const SHOW = {
  model({ el }, value) {
    el.value = value && typeof value === "object" ? "custom" : (value ?? "");
  },
  dim({ el, ctl }, value, { options }) {
    el.value = (value === undefined ? options.model_dims?.[ctl.key.split(".")[1]] : value) ?? "";
  },
  gpu({ el }, value, { scenario }) {
    el.value = scenario.gpu && typeof scenario.gpu === "object" ? "custom" : (scenario.gpu ?? "");
  },
  bool({ el }, value) {
    el.checked = Boolean(value);
  },
  log({ el, out, ctl }, value, { options }) {
    const stops = options.stops?.[ctl.key] ?? [];
    el.value = String(logIndex(stops, value ?? stops[0]));
    out.textContent = String(value ?? "");
  },
  headroom({ el, out }, value, { headroom }) {
    el.value = String(Math.round(headroom * 100));
    out.textContent = `${Math.round(headroom * 100)}%`;
  },
  targets({ el }, value, { doc, scenario, options }) {
    syncTargets(doc, el, scenario, options);
  },
};

function showPlain({ el, ctl }, value, { scenario, options }) {
  if (ctl.key === "gpu.memory_gib" && value === undefined) {
    value = (options.gpus ?? []).find((g) => g.id === scenario.gpu)?.memory_gib;
  }
  el.value = value === undefined || value === null ? "" : String(value);
}

/** Disabled (with its reason as tooltip), blocked choices, and the error mark of one control. */
function showState({ ctl, el, wrap }, reason, blocked, invalid) {
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
    const values = (blocked ?? []).map(String);
    for (const opt of el.options) opt.disabled = values.includes(opt.value);
  }
  wrap.classList.toggle("memsim-invalid", invalid);
  if (ctl.kind !== "targets") el.setAttribute("aria-invalid", String(invalid));
}

/** Put scenario values, headroom, disabled state and the error mark onto the controls. */
export function syncControls(doc, controls, scenario, options, headroom = 0.1, errorField = "") {
  const disabled = options.disabled ?? {};
  const disabledValues = options.disabled_values ?? {};
  const bad = controlForField(errorField, options);
  const s = { doc, scenario, options, headroom };
  for (const [key, entry] of controls) {
    const value = key === "headroom" ? headroom : getPath(scenario, key);
    (SHOW[entry.ctl.kind] ?? showPlain)(entry, value, s);
    showState(entry, disabled[key], disabledValues[key], key === bad);
  }
}

/** Listen to every control: `commit(key, value)` on change (nothing for an empty number); sliders update
 * their value label while they move. `options()` gives the current options. */
export function wireControls({ listen }, controls, options, commit) {
  for (const [key, { ctl, el, out }] of controls) {
    if (ctl.kind === "targets") {
      listen(el, "change", () => {
        commit(key, [...el.querySelectorAll("input")].filter((b) => b.checked).map((b) => b.value));
      });
      continue;
    }
    if (ctl.kind === "log" || ctl.kind === "headroom") {
      listen(el, "input", () => {
        out.textContent = ctl.kind === "log" ? String(readControl(ctl, el, options())) : `${el.value}%`;
      });
    }
    listen(el, "change", () => {
      const value = ctl.kind === "headroom" ? Number(el.value) / 100 : readControl(ctl, el, options());
      if (typeof value === "number" && Number.isNaN(value)) return;
      commit(key, value);
    });
  }
}

const CATALOGS = ["controls", "presets", "gpus", "choices", "stops"];
const catalogs = (options) => JSON.stringify(CATALOGS.map((k) => options[k]));

/** The controls of a view, from the `options` trait: `root` (the element shown now), `sync()` (show the
 * model's scenario, headroom and error field), and `update()` for new options (the controls are rebuilt only
 * when a catalog changed, which is rare). A control's change writes `scenario_data` or `headroom`. */
export function controlsPanel(ctx) {
  const { doc, model } = ctx;
  let options = readTrait(model, "options") ?? {};
  let signature = catalogs(options);
  let built = createControls(doc, options);
  const commit = (key, value) => {
    if (key === "headroom") model.set("headroom", value);
    else model.set("scenario_data", applyControl(model.get("scenario_data") ?? {}, key, value, options));
    model.save_changes();
  };
  const wire = () => wireControls(ctx, built.controls, () => options, commit);
  const panel = {
    root: built.root,
    sync() {
      syncControls(doc, built.controls, model.get("scenario_data") ?? {}, options, model.get("headroom") ?? 0.1,
        model.get("error_field") ?? "");
    },
    update() {
      options = readTrait(model, "options") ?? {};
      const next = catalogs(options);
      if (next === signature) return;
      signature = next;
      const fresh = createControls(doc, options);
      built.root.replaceWith(fresh.root);
      built = fresh;
      panel.root = fresh.root;
      wire();
    },
  };
  wire();
  return panel;
}
