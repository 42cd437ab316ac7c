// memsim-widget front end, bundled by esbuild from js/src/ (node js/build.mjs): edit the sources, not
// this file. A node test (tests/js/bundle.test.mjs) fails when it differs from a fresh build.

// js/src/dom.js
var uid = 0;
function nextId(prefix) {
  return `${prefix}-${++uid}`;
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
function fillSelect(doc, select, values, labels = {}) {
  select.replaceChildren(
    ...values.map(
      (v) => h(doc, "option", { value: v === null ? "" : String(v), text: labels[String(v)] ?? String(v) })
    )
  );
}
function thead(doc, labels) {
  return h(doc, "thead", {}, [h(doc, "tr", {}, labels.map((t) => h(doc, "th", { text: t })))]);
}
function applyButton(doc, attrs, enabled, text = "Apply") {
  const b = h(doc, "button", { type: "button", ...attrs, text });
  b.disabled = !enabled;
  return b;
}
function download(doc, href, name) {
  const a = h(doc, "a", { href, download: name });
  doc.body.append(a);
  a.click();
  a.remove();
}
function mark(name) {
  const perf = globalThis.performance;
  if (typeof perf?.mark !== "function" || perf.getEntriesByName?.(`memsim:${name}`).length) return;
  perf.mark(`memsim:${name}`);
}

// js/src/state.js
var parsed = /* @__PURE__ */ new WeakMap();
function readTrait(model, key) {
  const value = model.get(key);
  if (typeof value !== "string") return value;
  let cache = parsed.get(model);
  if (!cache) parsed.set(model, cache = /* @__PURE__ */ new Map());
  const hit = cache.get(key);
  if (hit && hit.text === value) return hit.value;
  const out = value ? JSON.parse(value) : {};
  cache.set(key, { text: value, value: out });
  return out;
}
function getPath(obj, key) {
  let cur = obj;
  for (const part of key.split(".")) {
    if (cur === null || typeof cur !== "object") return void 0;
    cur = cur[part];
  }
  return cur;
}
function setPath(obj, key, value) {
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
function viewContext(doc, model) {
  const disposers = [];
  const defer = (fn) => disposers.push(fn);
  return {
    doc,
    model,
    defer,
    listen(target, type, fn) {
      target.addEventListener(type, fn);
      defer(() => target.removeEventListener(type, fn));
    },
    onModel(name, fn) {
      model.on(`change:${name}`, fn);
      defer(() => model.off(`change:${name}`, fn));
    },
    bundle: () => model.get("_vega_js") ?? "",
    /** Write trait `name` and send it to Python. */
    save(name, value) {
      model.set(name, value);
      model.save_changes();
    },
    dispose() {
      for (const fn of disposers.splice(0)) fn();
    }
  };
}

// js/src/calibration.js
function calibrationText(calibration) {
  return `Calibrating ${calibration.model || "the model"} from traces (about a dozen tiny traces, ~30 s the first time): showing the last result until its estimate is ready.`;
}
function createCalibrationLine(doc) {
  return h(doc, "div", { class: "memsim-calibrating", role: "status", hidden: "" });
}
function isCalibrating(model) {
  return (readTrait(model, "calibration") ?? {}).state === "running";
}
function showCalibration(line, model) {
  const running = isCalibrating(model);
  line.textContent = running ? calibrationText(readTrait(model, "calibration")) : "";
  line.hidden = !running;
}

// js/src/charts.js
var bundles = /* @__PURE__ */ new Map();
async function importText(src) {
  if (typeof Blob !== "undefined" && typeof URL?.createObjectURL === "function") {
    const url = URL.createObjectURL(new Blob([src], { type: "text/javascript" }));
    try {
      return await import(
        /* webpackIgnore: true */
        url
      );
    } catch {
    } finally {
      URL.revokeObjectURL(url);
    }
  }
  return import(
    /* webpackIgnore: true */
    "data:text/javascript;charset=utf-8," + encodeURIComponent(src)
  );
}
function importFromSource(src) {
  if (!bundles.has(src)) bundles.set(src, importText(src));
  return bundles.get(src);
}
var deps = {
  async loadVegaEmbed(src) {
    if (!src) return null;
    const mod = await importFromSource(src);
    return mod.vegaEmbed ?? mod.default ?? null;
  }
};
function afterPaint(win) {
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
function viewStore() {
  const views = {};
  const finalizers = {};
  const drawn = {};
  return {
    views,
    drawn,
    finalizers,
    drop(name) {
      finalizers[name]?.();
      delete finalizers[name];
      delete views[name];
      delete drawn[name];
    },
    keep(name, res, text) {
      finalizers[name]?.();
      views[name] = res.view;
      finalizers[name] = () => res.finalize?.();
      drawn[name] = text;
    }
  };
}
function chartDrawer(doc, els, getSpecs, getBundle) {
  let token = 0;
  const store = viewStore();
  const embedOne = async (embed, name, spec, mine) => {
    const text = JSON.stringify(spec);
    if (store.drawn[name] === text && store.views[name]) return true;
    await afterPaint(doc.defaultView);
    if (mine !== token) return false;
    try {
      const res = await embed(els[name], structuredClone(spec), { actions: false, renderer: "svg" });
      if (mine !== token) {
        res.finalize?.();
        return false;
      }
      store.keep(name, res, text);
      mark(`drawn-${name}`);
    } catch (err) {
      els[name].textContent = `chart error: ${err.message}`;
      delete store.drawn[name];
    }
    return true;
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
        if (!spec) store.drop(name);
        else delete store.drawn[name];
        els[name].textContent = embed || !spec ? "" : "charts need vl-convert-python in the kernel";
        continue;
      }
      if (!await embedOne(embed, name, spec, mine)) return;
    }
  };
  draw.views = store.views;
  draw.forget = () => {
    for (const name of Object.keys(store.drawn)) delete store.drawn[name];
  };
  draw.dispose = () => {
    token++;
    for (const name of Object.keys(store.finalizers)) store.finalizers[name]?.();
  };
  return draw;
}
function drawCharts(ctx, els, getSpecs, traits = []) {
  const draw = chartDrawer(ctx.doc, els, getSpecs, ctx.bundle);
  ctx.defer(() => draw.dispose());
  for (const name of traits) ctx.onModel(name, draw);
  ctx.onModel("_vega_js", () => {
    draw.forget();
    draw();
  });
  return draw;
}
function createChartBlocks(doc, names = ["breakdown", "scaling", "time", "phases"]) {
  const els = {};
  const buttons = [];
  const blocks = {};
  for (const name of names) {
    els[name] = h(doc, "div", { class: `memsim-chart memsim-chart-${name}` });
    const tools = ["png", "svg"].map((fmt) => {
      const btn = h(doc, "button", {
        type: "button",
        class: `memsim-export memsim-${fmt}-${name}`,
        text: fmt.toUpperCase()
      });
      buttons.push({ btn, name, fmt });
      return btn;
    });
    blocks[name] = h(doc, "div", { class: `memsim-chart-block memsim-block-${name}` }, [
      els[name],
      h(doc, "div", { class: "memsim-tools" }, tools)
    ]);
  }
  return { els, blocks, buttons };
}
function createScalingNote(doc, block) {
  const note = h(doc, "div", {
    class: "memsim-scaling-updating",
    role: "status",
    hidden: "",
    text: "updating for the new scenario… (the chart shown is the previous one)"
  });
  block.prepend(note);
  return note;
}
function showScalingPending(block, note, result) {
  const pending = Boolean(result?.scaling?.pending);
  block.classList.toggle("memsim-updating", pending);
  note.hidden = !pending;
}
function showChartBlocks(blocks, specs, optional = ["phases"]) {
  for (const name of optional) if (blocks[name]) blocks[name].hidden = !specs?.[name];
}
function wireImageButtons(ctx, buttons, draw) {
  for (const { btn, name, fmt } of buttons) {
    ctx.listen(btn, "click", async () => {
      const view = draw.views[name];
      if (!view) return;
      const url = await view.toImageURL(fmt, fmt === "png" ? 2 : 1);
      download(ctx.doc, url, `memsim-${name}.${fmt}`);
    });
  }
}

// js/src/compare.js
var PIN_HINT = "Pin this scenario, then change a knob: the pins and the current scenario are compared side by side";
var COMPARE_ROWS = [
  ["peak per GPU", "peak"],
  ["verdict", "verdict"],
  ["step time", "step_time"],
  ["tokens/s per GPU", "tokens_per_second"],
  ["MFU", "mfu"]
];
function createComparePanel(doc) {
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
function withPin(pins, scenario) {
  return [...pins ?? [], { name: "", scenario: structuredClone(scenario ?? {}) }];
}
function withoutPin(pins, index) {
  return (pins ?? []).filter((_, i) => i !== index);
}
function compareTable(doc, view) {
  const names = view.names ?? [];
  const thead2 = h(doc, "thead", {}, [h(doc, "tr", {}, [h(doc, "th"), ...names.map((n) => h(doc, "th", { text: n }))])]);
  const body = h(doc, "tbody");
  for (const [label, key] of COMPARE_ROWS) {
    body.append(h(doc, "tr", { class: `memsim-compare-row memsim-compare-${key.replace(/_/g, "-")}` }, [
      h(doc, "th", { text: label }),
      ...(view.rows ?? []).map((r) => h(doc, "td", { class: key === "verdict" ? `memsim-compare-${r.verdict.replace(/ /g, "-")}` : "", text: r[key] }))
    ]));
  }
  const diffs = view.differences ?? [];
  for (const d of diffs) {
    body.append(h(doc, "tr", { class: "memsim-compare-diff" }, [
      h(doc, "th", { text: d.field }),
      ...d.values.map((v, i) => h(doc, "td", { class: d.changed[i] ? "memsim-compare-changed" : "", text: v }))
    ]));
  }
  if (!diffs.length) {
    body.append(h(doc, "tr", { class: "memsim-compare-same" }, [h(doc, "td", {
      colspan: String(names.length + 1),
      text: "no scenario field differs"
    })]));
  }
  return h(doc, "table", { class: "memsim-table memsim-compare-table" }, [thead2, body]);
}
function statusText(pins, max, rejected) {
  if (rejected) return "the input shown is rejected: fix it to pin it";
  if (pins.length >= max) return `${max} pinned: remove one to pin another`;
  return pins.length ? `${pins.length} of ${max} pinned; change a knob to compare` : PIN_HINT;
}
function renderCompare(doc, panel, comparison = {}, rejected = false) {
  const pins = comparison.pins ?? [];
  const max = comparison.max_pins ?? 3;
  panel.pin.disabled = rejected || pins.length >= max;
  panel.status.textContent = statusText(pins, max, rejected);
  panel.pins.replaceChildren(...pins.map((p, i) => h(doc, "li", { class: "memsim-pin-item" }, [
    h(doc, "b", { text: p.name }),
    `: ${p.summary} `,
    h(doc, "button", {
      type: "button",
      class: "memsim-unpin",
      "data-unpin": String(i),
      text: "remove",
      title: `Remove ${p.name} from the comparison`
    })
  ])));
  panel.error.hidden = !comparison.error;
  panel.error.textContent = comparison.error ? `Pin refused: ${comparison.error}` : "";
  const view = comparison.view;
  panel.body.hidden = !view;
  panel.table.replaceChildren(...view ? [compareTable(doc, view)] : []);
}
function wireCompare(ctx, panel) {
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

// js/src/controls.js
function ctlClass(key) {
  return "memsim-ctl-" + key.replace(/\./g, "-");
}
function logIndex(stops, value) {
  let idx = 0;
  stops.forEach((s, i) => {
    if (s <= value) idx = i;
  });
  return idx;
}
function controlForField(field, options = {}) {
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
  return { ...structuredClone(scenario), model: { model_type: "llama", ...options.model_dims ?? {} } };
}
function customGpu(scenario, raw, options) {
  if (raw !== "custom") return { ...structuredClone(scenario), gpu: raw };
  const current = scenario.gpu;
  if (current && typeof current === "object") return structuredClone(scenario);
  const known = (options.gpus ?? []).find((g) => g.id === current);
  return { ...structuredClone(scenario), gpu: { memory_gib: known ? known.memory_gib : 80 } };
}
function applyControl(scenario, key, raw, options = {}) {
  if (key === "model") return customModel(scenario, String(raw).trim(), options);
  if (key === "gpu") return customGpu(scenario, raw, options);
  return setPath(scenario, key, raw);
}
function readControl(ctl, el, options = {}) {
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
      if (el.value === "" && choices.includes(null)) return null;
      return typeof choices[0] === "number" ? Number(el.value) : el.value;
    }
    default:
      return el.value;
  }
}
var range = (doc, cls, max) => h(doc, "input", { type: "range", min: "0", max: String(max), step: "1", class: cls });
var INPUTS = {
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
    out: h(doc, "output", { class: "memsim-value" })
  }),
  headroom: (doc, ctl, cls) => ({ el: range(doc, cls, 50), out: h(doc, "output", { class: "memsim-value" }) }),
  targets: (doc, ctl, cls) => ({ el: h(doc, "div", { class: `${cls} memsim-targets`, role: "group" }) })
};
function numberInput(doc, ctl, cls) {
  const real = ctl.kind === "number";
  return { el: h(doc, "input", { type: "number", class: cls, min: real ? "0" : "1", step: real ? "any" : "1" }) };
}
function fieldset(doc, group) {
  return h(doc, "fieldset", { class: `memsim-group memsim-group-${group.toLowerCase()}` }, [
    h(doc, "legend", { text: group })
  ]);
}
function createControls(doc, options) {
  const root = h(doc, "div", { class: "memsim-controls" });
  const controls = /* @__PURE__ */ new Map();
  const groups = /* @__PURE__ */ new Map();
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
  const names = [.../* @__PURE__ */ new Set([...options.lora_targets ?? [], ...chosen])];
  const have = [...el.querySelectorAll("input")].map((i) => i.value).join("|");
  if (have !== names.join("|")) {
    el.replaceChildren(
      ...names.map(
        (n) => h(doc, "label", { class: "memsim-target" }, [h(doc, "input", { type: "checkbox", value: n }), ` ${n}`])
      )
    );
  }
  for (const box of el.querySelectorAll("input")) box.checked = chosen.includes(box.value);
}
var SHOW = {
  model({ el }, value) {
    el.value = value && typeof value === "object" ? "custom" : value ?? "";
  },
  dim({ el, ctl }, value, { options }) {
    el.value = (value === void 0 ? options.model_dims?.[ctl.key.split(".")[1]] : value) ?? "";
  },
  gpu({ el }, value, { scenario }) {
    el.value = scenario.gpu && typeof scenario.gpu === "object" ? "custom" : scenario.gpu ?? "";
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
  }
};
function showPlain({ el, ctl }, value, { scenario, options }) {
  if (ctl.key === "gpu.memory_gib" && value === void 0) {
    value = (options.gpus ?? []).find((g) => g.id === scenario.gpu)?.memory_gib;
  }
  el.value = value === void 0 || value === null ? "" : String(value);
}
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
function syncControls(doc, controls, scenario, options, headroom = 0.1, errorField = "") {
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
function wireControls({ listen }, controls, options, commit) {
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
var CATALOGS = ["controls", "presets", "gpus", "choices", "stops"];
var catalogs = (options) => JSON.stringify(CATALOGS.map((k) => options[k]));
function controlsPanel(ctx) {
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
      syncControls(
        doc,
        built.controls,
        model.get("scenario_data") ?? {},
        options,
        model.get("headroom") ?? 0.1,
        model.get("error_field") ?? ""
      );
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
    }
  };
  wire();
  return panel;
}

// js/src/export.js
function createExportPanel(doc) {
  const select = h(doc, "select", { class: "memsim-export-format", "aria-label": "launch config format" });
  const button = h(doc, "button", { type: "button", class: "memsim-export-config", text: "Export" });
  const status = h(doc, "span", { class: "memsim-export-status", role: "status" });
  const root = h(doc, "details", { class: "memsim-details-export" }, [
    h(doc, "summary", { text: "launch config" }),
    select,
    button,
    status
  ]);
  return { root, select, button, status };
}
function renderExport(doc, panel, state = {}) {
  const formats = state.formats ?? [];
  if ([...panel.select.options].map((o) => o.value).join() !== formats.join()) fillSelect(doc, panel.select, formats);
  panel.root.hidden = formats.length === 0;
  const names = Object.keys(state.files ?? {});
  panel.status.textContent = state.error || (names.length ? `downloaded ${names.join(", ")}` : "");
  panel.status.classList.toggle("memsim-export-error", Boolean(state.error));
}
function exportBlobs(files = {}) {
  return Object.entries(files).map(([name, text]) => ({ name, blob: new Blob([text], { type: "text/plain;charset=utf-8" }) }));
}
function wireExport(ctx, panel) {
  const { doc, model } = ctx;
  let asked = null;
  const show = () => renderExport(doc, panel, model.get("export") ?? {});
  ctx.listen(panel.button, "click", () => {
    asked = model.get("export")?.id ?? 0;
    model.send({ type: "export", format: panel.select.value });
  });
  ctx.onModel("export", () => {
    show();
    const state = model.get("export") ?? {};
    if (asked === null || !(state.id > asked)) return;
    asked = null;
    for (const { name, blob } of exportBlobs(state.files)) {
      const url = URL.createObjectURL(blob);
      download(doc, url, name);
      setTimeout(() => URL.revokeObjectURL(url), 1e3);
    }
  });
  return show;
}

// js/src/format.js
var CSV_COLUMNS = ["rank", "stage", "moment", "category", "item", "bytes", "gib", "counter", "formula"];
function fmtBytes(n) {
  const units = [["GiB", 1024 ** 3], ["MiB", 1024 ** 2], ["KiB", 1024]];
  for (const [unit, size] of units) {
    if (Math.abs(n) >= size) return `${(n / size).toFixed(2)} ${unit}`;
  }
  return `${Math.trunc(n)} B`;
}
function fmtGiB(gib) {
  return `${Number(gib ?? 0).toFixed(2)} GiB`;
}
function fmtPct(x) {
  if (x === null || x === void 0 || Number.isNaN(x)) return "n/a";
  return `${x > 0 ? "+" : ""}${Number(x).toFixed(2)}%`;
}
function fmtCount(n) {
  return Number(n ?? 0).toLocaleString("en-US");
}
function rowsToCsv(rows, columns = CSV_COLUMNS) {
  const cell = (v) => {
    const s = v === null || v === void 0 ? "" : String(v);
    return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  };
  return [columns.join(","), ...rows.map((r) => columns.map((c) => cell(r[c])).join(","))].join("\n") + "\n";
}

// js/src/layouts.js
function layoutText(r) {
  return `${r.layout}, ZeRO-${r.zero}${r.sequence_parallel ? ", sp" : ""}`;
}
function knobsText(r) {
  const parts = [
    r.activation_checkpointing === "none" ? "no ckpt" : `${r.activation_checkpointing} ckpt`,
    `${r.loss} loss`,
    r.optimizer
  ];
  if (r.offload && r.offload !== "none") parts.push(`offload ${r.offload}`);
  return parts.join(", ");
}
function createLayoutsPanel(doc) {
  const run = h(doc, "button", {
    type: "button",
    class: "memsim-layouts-run",
    text: "Search layouts",
    title: "Try every dp/tp/pp/cp layout and memory knob on this GPU type and rank what fits (throughput proxy)"
  });
  const gpus = h(doc, "input", {
    type: "number",
    class: "memsim-layouts-gpus",
    min: "1",
    step: "1",
    "aria-label": "GPUs to search"
  });
  const status = h(doc, "span", { class: "memsim-layouts-status", role: "status" });
  const error = h(doc, "div", { class: "memsim-layouts-error", role: "alert", hidden: "" });
  const stale = h(doc, "div", { class: "memsim-layouts-stale-label", hidden: "" });
  const summary = h(doc, "div", { class: "memsim-layouts-summary" });
  const table = h(doc, "div", { class: "memsim-layouts-table-holder" });
  const chart = h(doc, "div", { class: "memsim-chart memsim-chart-candidates" });
  const result = h(doc, "div", { class: "memsim-layouts-result", hidden: "" }, [stale, summary, table, chart]);
  const root = h(doc, "div", { class: "memsim-layouts" }, [
    h(doc, "div", { class: "memsim-layouts-bar" }, [
      h(doc, "b", { text: "Layouts" }),
      run,
      h(doc, "span", { text: "on" }),
      gpus,
      h(doc, "span", { text: "GPUs" }),
      status
    ]),
    error,
    result
  ]);
  return { root, run, gpus, status, error, result, stale, summary, table, charts: { candidates: chart } };
}
function exportsText(r) {
  const all = Object.entries(r.exports ?? {});
  const ok = all.filter(([, why]) => why === null).map(([fmt]) => fmt);
  const no = all.filter(([, why]) => why !== null).map(([fmt, why]) => `${fmt}: ${why}`);
  return { text: ok.length ? ok.join(", ") : "none", title: no.length ? `not exported:
${no.join("\n")}` : "every format" };
}
function summaryText(layouts, v) {
  const counts = (v.gpu_counts ?? []).join(", ");
  return (v.widened ? v.widened.charAt(0).toUpperCase() + v.widened.slice(1) : "") + `${fmtCount(v.evaluated)} candidates for ${v.model} on ${counts} × ${v.gpu}: ${fmtCount(v.fitting)} fit` + (typeof layouts.ms === "number" ? ` (searched in ${layouts.ms.toFixed(0)} ms)` : "") + (v.fitting ? ". Best by modelled tokens/s per GPU:" : ". Nothing fits: try more GPUs, or a change above.");
}
function layoutRow(doc, r, ok) {
  const current = Boolean(r.current);
  return h(doc, "tr", { class: `memsim-layout-row${current ? " memsim-layout-current" : ""}` }, [
    h(doc, "td", { text: String(r.rank) }),
    h(doc, "td", { class: "memsim-col-layout", text: layoutText(r) }),
    h(doc, "td", {
      class: "memsim-col-mb",
      text: `${r.micro_batch_size} × ${r.grad_accum_steps}`,
      title: "micro-batch × gradient accumulation steps"
    }),
    h(doc, "td", { class: "memsim-col-knobs", text: knobsText(r) }),
    h(doc, "td", { class: "memsim-col-size", text: fmtBytes(r.device_total_bytes) }),
    h(doc, "td", { class: "memsim-col-size", text: Number(r.tokens_per_gpu_s).toLocaleString("en-US", { maximumFractionDigits: 0 }) }),
    h(doc, "td", { class: "memsim-col-exports", ...exportsText(r) }),
    h(doc, "td", {}, [applyButton(
      doc,
      {
        class: "memsim-layout-apply",
        "data-candidate": String(r.candidate),
        title: current ? "the scenario uses this layout" : "Set the scenario to this layout"
      },
      ok && !current,
      current ? "current" : "Apply"
    )])
  ]);
}
function renderLayouts(doc, panel, layouts = {}, scenario = {}) {
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
  panel.stale.textContent = stale ? `Searched for another scenario${keys.length ? ` (${keys.join(", ")} changed since)` : ""}. Search again.` : "";
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
function wireLayouts(ctx, panel) {
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

// js/src/fit.js
function createFitPanel(doc) {
  const toggle = h(doc, "button", {
    type: "button",
    class: "memsim-fit-toggle memsim-ctl-fit",
    "aria-expanded": "false",
    text: "Make it fit",
    title: "What to change so that this scenario fits the GPU, or how far it can be pushed when it does"
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
    h(doc, "div", { class: "memsim-fit-bar" }, [toggle, status]),
    body
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
      h(doc, "td", {}, [applyButton(doc, {
        class: "memsim-fit-apply",
        "data-apply": kind,
        "data-index": String(c.index),
        title: `Set the scenario to: ${c.label}`
      }, enabled)])
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
var given = (x) => x !== null && x !== void 0;
function reachFact(doc, v, kind, what, now, enabled) {
  const r = v[kind];
  if (!r) return null;
  const gpus = v.num_gpus > 1 ? `these ${v.num_gpus} GPUs` : "this GPU";
  return fact(doc, `${what} on ${gpus} with any layout: ${r.value} (now ${now}) as ${r.layout}; ${r.device_total} per GPU, ${fmtCount(Math.round(r.tokens_per_gpu_s))} tokens/s/GPU modelled, the cheapest of ${fmtCount(r.reaching)} that reach it (global batch free)`, kind, enabled && r.value !== now);
}
function reachFacts(doc, v, enabled) {
  return [
    reachFact(doc, v, "max_micro_batch_searched", "largest micro-batch", v.micro_batch_size, enabled),
    reachFact(doc, v, "max_seq_len_searched", "longest sequence", v.seq_len, enabled)
  ].filter(Boolean);
}
function renderFits(doc, panel, v, need, enabled) {
  panel.headline.replaceChildren(
    h(doc, "b", { class: "memsim-fit-word", text: "fits" }),
    `: ${need}, ${fmtBytes(v.spare_bytes)} to spare. How far it goes:`
  );
  panel.list.replaceChildren();
  const facts = [];
  if (given(v.max_micro_batch)) {
    facts.push(fact(
      doc,
      `largest micro-batch that fits: ${v.max_micro_batch} (now ${v.micro_batch_size})`,
      "max_micro_batch",
      enabled && v.max_micro_batch !== v.micro_batch_size
    ));
  }
  if (given(v.max_seq_len)) {
    facts.push(fact(
      doc,
      `longest sequence that fits: ${v.max_seq_len} (now ${v.seq_len})`,
      "max_seq_len",
      enabled && v.max_seq_len !== v.seq_len
    ));
  }
  return [...facts, ...reachFacts(doc, v, enabled)];
}
function renderFixes(doc, panel, v, need, enabled) {
  const changes = v.changes ?? [];
  panel.headline.replaceChildren(h(doc, "b", { class: "memsim-fit-word", text: v.verdict }), `: ${need}. ` + (changes.length ? "Smallest changes that fit:" : `No change fits: ${v.bound ?? "no lever applies"}.`));
  panel.list.replaceChildren(...changes.length ? [changesTable(doc, changes, "change", enabled)] : []);
  const facts = [];
  if (changes.length && v.bound) facts.push(fact(doc, `no change that keeps the job fits: ${v.bound}`, "", false));
  const first = v.with_first_fix;
  if (first && first.max_micro_batch) {
    facts.push(fact(doc, `with “${first.change}”, micro-batches up to ${first.max_micro_batch} fit`, "", false));
  }
  return [...facts, ...reachFacts(doc, v, enabled)];
}
function minGpusFacts(doc, v, enabled) {
  const r = v.min_gpus_searched;
  const mg = v.min_gpus;
  const facts = [];
  if (r) {
    const below = r.next_stop ? `; ${r.next_stop} GPU${r.next_stop > 1 ? "s" : ""} fit none` : "";
    facts.push(fact(doc, `fewest GPUs with any layout and knobs: ${r.value} (now ${v.num_gpus}) as ${r.layout}; ${r.device_total} per GPU, ${fmtCount(Math.round(r.tokens_per_gpu_s))} tokens/s/GPU modelled, the cheapest of ${fmtCount(r.reaching)} that fit (global batch free${below})`, "min_gpus_searched", enabled));
  }
  if (r && mg && mg.num_gpus === r.value) return facts;
  if (!mg) {
    facts.push(fact(doc, "with these knobs more GPUs alone do not make it fit (data parallelism with ZeRO-3 up to 4096; tp/pp layouts up to 1024)", "", false));
    return facts;
  }
  const layout = `dp=${mg.dp}` + (mg.tp > 1 ? ` tp=${mg.tp}` : "") + (mg.pp > 1 ? ` pp=${mg.pp}` : "");
  facts.push(fact(
    doc,
    `fewest GPUs that fit with these knobs: ${mg.num_gpus} (${layout}, ZeRO-${mg.zero}, the fastest layout there; ${fmtBytes(mg.device_total_bytes)} per GPU; now ${v.num_gpus})`,
    "min_gpus",
    enabled && mg.num_gpus !== v.num_gpus
  ));
  return facts;
}
function cardFacts(doc, v) {
  const card = v.smallest_card;
  if (v.fits) return [];
  if (!card) return [fact(doc, "no card in the catalog holds it as it is", "", false)];
  return [fact(
    doc,
    `smallest card that holds it as it is: ${card.name} (${fmtBytes(card.device_total_bytes)} per GPU)`,
    "",
    false
  )];
}
function renderLevers(doc, panel, v, enabled) {
  const levers = v.levers ?? [];
  const table = levers.length ? changesTable(doc, levers, "lever", enabled) : h(doc, "span", { text: "none applies" });
  if (v.fits) {
    panel.levers.replaceChildren(
      h(doc, "div", { class: "memsim-fit-subhead", text: "What each single change would save:" }),
      table
    );
  } else {
    panel.levers.replaceChildren(h(doc, "details", { class: "memsim-fit-levers-all" }, [
      h(doc, "summary", { text: `each single change alone (${levers.length})` }),
      table
    ]));
  }
}
function renderFit(doc, panel, open, fit = {}) {
  panel.toggle.setAttribute("aria-expanded", String(Boolean(open)));
  panel.root.classList.toggle("memsim-fit-open", Boolean(open));
  panel.body.hidden = !open;
  const state = fit.state ?? "idle";
  const v = fit.view;
  panel.status.textContent = !open ? "" : state === "running" ? "finding what fits…" : state === "done" && typeof fit.ms === "number" ? `computed in ${fit.ms.toFixed(0)} ms` : "";
  panel.error.hidden = !fit.error;
  panel.error.textContent = fit.error ? `Make it fit: ${fit.error}` : "";
  panel.result.hidden = !v;
  panel.result.classList.toggle("memsim-fit-stale", Boolean(v && fit.stale));
  panel.stale.hidden = !(v && (fit.stale || fit.rejected));
  panel.stale.textContent = fit.stale ? "For the previous scenario: updating…" : fit.rejected ? "For the last valid scenario (the input shown is rejected)." : "";
  if (!v) {
    for (const el of [panel.headline, panel.list, panel.facts, panel.levers]) el.replaceChildren();
    return;
  }
  const enabled = state === "done" && !fit.stale;
  const need = `${fmtBytes(v.device_total_bytes)} per GPU, ${fmtBytes(v.usable_bytes)} usable on ${v.gpu} (${Math.round((v.headroom ?? 0) * 100)}% headroom)`;
  const facts = (v.fits ? renderFits : renderFixes)(doc, panel, v, need, enabled);
  panel.facts.replaceChildren(...facts, ...minGpusFacts(doc, v, enabled), ...cardFacts(doc, v));
  renderLevers(doc, panel, v, enabled);
}
function sendApply(model, button) {
  if (button.hasAttribute("data-apply")) {
    model.send({
      type: "fit_apply",
      kind: button.getAttribute("data-apply"),
      index: Number(button.getAttribute("data-index")),
      id: readTrait(model, "fit")?.id
    });
  } else {
    model.send({
      type: "layout_apply",
      candidate: Number(button.getAttribute("data-candidate")),
      id: readTrait(model, "layouts")?.id
    });
  }
}
function wireFit(ctx, panel) {
  const { doc, model } = ctx;
  const show = () => renderFit(doc, panel, model.get("fit_open"), readTrait(model, "fit") ?? {});
  ctx.listen(panel.toggle, "click", () => ctx.save("fit_open", !model.get("fit_open")));
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

// js/src/import.js
var ACCEPT = ".yaml,.yml,.json,.toml,.py,.sh";
function createImportPanel(doc) {
  const input = h(doc, "input", {
    type: "file",
    multiple: "",
    accept: ACCEPT,
    class: "memsim-import-files",
    "aria-label": "your launch config files (axolotl, LLaMA-Factory, torchtune, torchtitan, accelerate, DeepSpeed, TrainingArguments)"
  });
  const status = h(doc, "div", { class: "memsim-import-status", role: "status" });
  const unread = h(doc, "ul", { class: "memsim-import-unread" });
  const root = h(doc, "details", { class: "memsim-details-import" }, [
    h(doc, "summary", { text: "open a config" }),
    input,
    status,
    unread
  ]);
  return { root, input, status, unread };
}
function renderImport(doc, panel, state = {}) {
  const files = state.files ?? [];
  const lines = state.unread ?? [];
  panel.status.textContent = state.error ? state.error : files.length ? `read ${files.join(", ")}: ${lines.length} setting(s) not in the files, memsim's assumption shown` : "";
  panel.status.classList.toggle("memsim-import-error", Boolean(state.error));
  panel.unread.replaceChildren(...lines.map((line) => h(doc, "li", { text: line })));
}
async function readFiles(fileList) {
  return Promise.all([...fileList ?? []].map(async (f) => ({ name: f.name, text: await f.text() })));
}
function wireImport(ctx, panel) {
  const { doc, model } = ctx;
  const show = () => renderImport(doc, panel, model.get("config_import") ?? {});
  ctx.listen(panel.input, "change", async () => {
    const files = await readFiles(panel.input.files);
    if (files.length) model.send({ type: "import_config", files, format: "auto" });
  });
  ctx.onModel("config_import", show);
  return show;
}
function createMeasurePanel(doc) {
  const button = h(doc, "button", {
    type: "button",
    class: "memsim-measure",
    text: "Measure on this GPU",
    title: "Run three real training steps of this scenario on this machine's GPU (random weights) and compare"
  });
  const status = h(doc, "span", { class: "memsim-measure-status", role: "status" });
  const text = h(doc, "pre", { class: "memsim-measure-text", hidden: "" });
  const root = h(doc, "div", { class: "memsim-measure-panel", hidden: "" }, [button, status, text]);
  return { root, button, status, text };
}
function renderMeasure(panel, state = {}) {
  panel.root.hidden = !state.available;
  const running = state.state === "running";
  panel.button.disabled = running;
  panel.status.textContent = running ? "measuring (three real steps)…" : state.error ?? "";
  panel.text.hidden = !state.text;
  panel.text.textContent = state.text ?? "";
}
function wireMeasure(ctx, panel) {
  const { model } = ctx;
  const show = () => renderMeasure(panel, model.get("measure") ?? {});
  ctx.listen(panel.button, "click", () => {
    if (!panel.button.disabled) model.send({ type: "measure" });
  });
  ctx.onModel("measure", show);
  return show;
}

// js/src/scenario-json.js
function createJsonEditor(doc) {
  const area = h(doc, "textarea", { class: "memsim-json", rows: "14", spellcheck: "false" });
  const copy = h(doc, "button", { type: "button", class: "memsim-copy", text: "copy" });
  const apply = h(doc, "button", { type: "button", class: "memsim-apply", text: "apply JSON" });
  const root = h(doc, "details", { class: "memsim-details-json" }, [
    h(doc, "summary", { text: "scenario JSON" }),
    area,
    h(doc, "div", { class: "memsim-tools" }, [copy, apply])
  ]);
  return { root, area, copy, apply };
}
function parseScenario(text) {
  let parsed2;
  try {
    parsed2 = JSON.parse(text);
  } catch (err) {
    return { error: `scenario JSON: ${err.message}` };
  }
  if (parsed2 === null || typeof parsed2 !== "object" || Array.isArray(parsed2)) {
    return { error: "scenario JSON: must be an object ({...})" };
  }
  return { scenario: parsed2 };
}
function wireJsonEditor(ctx, editor, fail) {
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

// js/src/trace.js
var TRACE_HINT = "Trace two training steps of this scenario on fake tensors (CPU, nothing allocated) and compare the measured live tensor bytes with the simulation";
function traceProgressText(p = {}) {
  const parts = [];
  if (p.step === void 0) {
    parts.push(p.stage ?? "starting");
  } else {
    parts.push(p.step >= 1 ? `step ${p.step}/${p.steps ?? 2}: ${p.phase ?? ""}` : String(p.phase ?? p.stage));
    parts.push(`${fmtCount(p.ops)} ops`);
    if (p.live_bytes !== void 0) parts.push(`${fmtBytes(p.live_bytes)} live`);
    if (p.peak_bytes) parts.push(`peak so far ${fmtBytes(p.peak_bytes)}`);
  }
  if (p.elapsed_s !== void 0) parts.push(`${Number(p.elapsed_s).toFixed(1)} s`);
  return parts.join(" · ");
}
function errorClass(pct) {
  if (pct === null || pct === void 0) return "memsim-err-none";
  const a = Math.abs(pct);
  return a <= 2 ? "memsim-err-ok" : a <= 5 ? "memsim-err-warn" : "memsim-err-bad";
}
function createTracePanel(doc) {
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
    timeline: h(doc, "div", { class: "memsim-chart memsim-chart-trace-timeline" })
  };
  const notes = h(doc, "details", { class: "memsim-trace-notes", hidden: "" });
  const result = h(doc, "div", { class: "memsim-trace-result", hidden: "" }, [
    stale,
    headline,
    tableHolder,
    h(doc, "div", { class: "memsim-trace-charts" }, [charts.comparison, charts.timeline]),
    notes
  ]);
  const root = h(doc, "section", { class: "memsim-trace" }, [
    h(doc, "div", { class: "memsim-trace-bar" }, [button, status]),
    reason,
    progress,
    result
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
      h(doc, "td", { class: `memsim-col-error ${errorClass(c.error_pct)}`, text: fmtPct(c.error_pct) })
    ]));
  }
  const heads = thead(doc, ["category", "traced", "simulated", "error"]);
  return h(doc, "table", { class: "memsim-table memsim-trace-table" }, [heads, body]);
}
function countersTable(doc, counters) {
  const body = h(doc, "tbody");
  for (const c of counters ?? []) {
    body.append(h(doc, "tr", { class: "memsim-trace-counter" }, [
      h(doc, "td", { class: "memsim-col-category", text: c.counter }),
      h(doc, "td", { class: "memsim-col-size", text: fmtBytes(c.traced) }),
      h(doc, "td", { class: "memsim-col-size", text: fmtBytes(c.simulated) }),
      h(doc, "td", { class: `memsim-col-error ${errorClass(c.error_pct)}`, text: fmtPct(c.error_pct) })
    ]));
  }
  const heads = thead(doc, ["counter", "traced (replayed)", "simulated", "error"]);
  return h(doc, "table", { class: "memsim-table memsim-trace-counters" }, [heads, body]);
}
function rankLine(doc, rank) {
  if (!rank || Number(rank.world_size ?? 1) <= 1) return [];
  const sim = rank.simulated_role ? ` (simulated: ${rank.simulated_role})` : "";
  return [h(doc, "div", { class: "memsim-trace-rank", text: `traced ${rank.role || `rank ${rank.index}`}${sim}` })];
}
function statusText2(trace) {
  const state = trace.state ?? "idle";
  const p = trace.progress ?? {};
  if (state === "running") return trace.running_stale ? "tracing the scenario as it was when you clicked" : "tracing…";
  if (state === "cancelling") return "cancelling…";
  if (state === "done") return `traced in ${Number(p.elapsed_s ?? 0).toFixed(1)} s (${fmtCount(p.ops)} ops)`;
  if (state === "error") return `trace failed: ${trace.error ?? ""}`;
  if (state === "cancelled") return "trace cancelled";
  return "";
}
function renderButton(panel, trace) {
  const state = trace.state ?? "idle";
  const running = state === "running";
  const cancelling = state === "cancelling";
  const available = trace.available !== false;
  const { button } = panel;
  button.textContent = running ? "Cancel trace" : cancelling ? "Cancelling…" : "Verify with trace";
  button.disabled = cancelling || !running && !available;
  button.title = running ? "Stop the trace (it stops at its next module call)" : available ? TRACE_HINT : trace.reason ?? "";
  button.setAttribute("data-state", state);
  const off = !available && !running && !cancelling;
  panel.root.classList.toggle("memsim-trace-off", off);
  panel.reason.hidden = !off;
  panel.reason.textContent = off ? `Verify with trace is off: ${trace.reason ?? ""}` : "";
}
function renderProgress(panel, trace) {
  const state = trace.state ?? "idle";
  const busy = state === "running" || state === "cancelling";
  const p = trace.progress ?? {};
  panel.status.textContent = statusText2(trace);
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
    ` (${summary.model ?? "model"}, live tensor bytes)`
  );
  const counters = summary.counters ?? [];
  const onCard = summary.on_card ? [h(doc, "div", { class: "memsim-trace-on-card", text: summary.on_card })] : [];
  panel.tableHolder.replaceChildren(
    traceTable(doc, summary.categories),
    ...counters.length ? [countersTable(doc, counters)] : [],
    ...onCard
  );
  const notes = summary.notes ?? [];
  panel.notes.hidden = notes.length === 0;
  panel.notes.replaceChildren(
    h(doc, "summary", { text: `trace notes (${notes.length})` }),
    h(doc, "ul", {}, notes.map((n) => h(doc, "li", { text: n })))
  );
}
function renderTrace(doc, panel, trace = {}, view = {}) {
  renderButton(panel, trace);
  renderProgress(panel, trace);
  const summary = view?.summary;
  panel.result.hidden = !summary;
  const stale = Boolean(summary && trace.stale);
  panel.result.classList.toggle("memsim-trace-stale", stale);
  panel.stale.hidden = !stale;
  const keys = trace.stale_keys ?? [];
  panel.stale.textContent = stale ? `Stale: traced for another scenario${keys.length ? ` (${keys.join(", ")} changed since)` : ""}. Verify again to trace the current one.` : "";
  if (summary) {
    renderSummary(doc, panel, summary);
    return;
  }
  panel.headline.replaceChildren();
  panel.tableHolder.replaceChildren();
  panel.notes.replaceChildren();
  panel.notes.hidden = true;
}
function wireTrace(ctx, panel) {
  const { doc, model } = ctx;
  const show = () => renderTrace(doc, panel, model.get("trace") ?? {}, readTrait(model, "trace_view") ?? {});
  ctx.listen(panel.button, "click", () => {
    if (panel.button.disabled) return;
    model.send({ type: model.get("trace")?.state === "running" ? "cancel" : "verify" });
  });
  ctx.onModel("trace", show);
  ctx.onModel("trace_view", show);
  const draw = drawCharts(ctx, panel.charts, () => readTrait(model, "trace_view")?.charts, ["trace_view"]);
  return { show, draw };
}

// js/src/verdict.js
function verdictHead(doc, result) {
  const total = result.peaks?.[0];
  return h(doc, "div", { class: "memsim-verdict-head" }, [
    h(doc, "span", { class: "memsim-verdict-word", text: result.verdict }),
    h(doc, "span", {
      class: "memsim-verdict-peak",
      text: ` peak ${total ? total.size : "?"} (${total ? total.label : ""}) at ${result.peak_moment} on ${result.peak_rank}; ${result.gpu?.name} holds ${result.gpu?.memory_gib} GiB, ${Math.round(result.headroom * 100)}% headroom leaves ${fmtBytes(result.usable_bytes)}`
    })
  ]);
}
function peakList(doc, peaks, staged) {
  return h(doc, "ul", { class: "memsim-peaks" }, (peaks ?? []).map(
    (p) => h(doc, "li", { class: `memsim-peak memsim-peak-${p.label}` }, [
      h(doc, "b", { text: `${p.label} ${p.size}` }),
      ...staged && p.rank ? [h(doc, "span", { class: "memsim-peak-rank", text: ` on ${p.rank}` })] : [],
      ` predicts ${p.counter}`
    ])
  ));
}
var SCALING_PENDING_TEXT = "largest micro-batch and longest sequence that fit: updating…";
function scalingText(s) {
  if (s.pending) return SCALING_PENDING_TEXT;
  if (s.error) return `how it scales: ${s.error}`;
  const parts = [];
  const mb = s.micro_batch_size;
  if (mb) {
    parts.push(`largest micro-batch that fits: ${mb.max_fit ?? "none"}` + (mb.exceeds_at !== null && mb.exceeds_at !== void 0 ? ` (exceeds the GPU at ≈${mb.exceeds_at})` : ""));
  }
  if (s.seq_len?.fixed) parts.push(`sequence fixed at ${s.seq_len.fixed}`);
  else if (s.seq_len) parts.push(`longest sequence that fits: ${s.seq_len.max_fit ?? "none"}`);
  return parts.join("; ");
}
function renderVerdict(doc, el, result) {
  if (!result || !result.verdict) {
    el.replaceChildren();
    return;
  }
  const extra = [];
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
function buildTable(doc, rows) {
  const cols = [
    ["rank", "rank"],
    ["moment", "moment"],
    ["category", "category"],
    ["item", "item"],
    ["size", "size"],
    ["counter", "counted by"],
    ["formula", "formula"]
  ];
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
function createResultViews(doc) {
  const verdict = h(doc, "div", { class: "memsim-verdict" });
  const holder = h(doc, "div", { class: "memsim-table-holder" });
  const csv = h(doc, "a", { class: "memsim-csv", download: "memsim-breakdown.csv", text: "download CSV" });
  const details = h(doc, "details", { class: "memsim-details-table" }, [
    h(doc, "summary", { text: "breakdown table" }),
    csv,
    holder
  ]);
  return { verdict, details, holder, csv };
}
function renderResult(doc, views, result = {}) {
  renderVerdict(doc, views.verdict, result);
  views.holder.replaceChildren(buildTable(doc, result.rows ?? []));
  views.csv.href = "data:text/csv;charset=utf-8," + encodeURIComponent(rowsToCsv(result.rows ?? []));
}

// js/src/index.js
function createOutput(doc) {
  const parts = {
    error: h(doc, "div", { class: "memsim-error", role: "alert", hidden: "" }),
    calibrating: createCalibrationLine(doc),
    result: createResultViews(doc),
    charts: createChartBlocks(doc),
    trace: createTracePanel(doc),
    fit: createFitPanel(doc),
    compare: createComparePanel(doc),
    json: createJsonEditor(doc),
    export: createExportPanel(doc),
    import: createImportPanel(doc),
    measure: createMeasurePanel(doc)
  };
  parts.trace.root.append(parts.measure.root);
  parts.scalingNote = createScalingNote(doc, parts.charts.blocks.scaling);
  parts.root = h(doc, "div", { class: "memsim-output" }, [
    parts.error,
    parts.calibrating,
    parts.result.verdict,
    parts.fit.root,
    parts.compare.root,
    ...Object.values(parts.charts.blocks),
    parts.trace.root,
    parts.result.details,
    parts.json.root,
    parts.export.root,
    parts.import.root
  ]);
  return parts;
}
function render({ model, el }) {
  mark("render");
  const ctx = viewContext(el.ownerDocument, model);
  const { doc, onModel } = ctx;
  const controls = controlsPanel(ctx);
  const out = createOutput(doc);
  el.replaceChildren(h(doc, "div", { class: "memsim" }, [controls.root, out.root]));
  const fail = (message) => {
    out.error.textContent = message;
    out.error.hidden = false;
  };
  const syncJson = wireJsonEditor(ctx, out.json, fail);
  const syncAll = () => {
    controls.sync();
    syncJson();
  };
  const markStale = () => out.root.classList.toggle("memsim-stale", Boolean(model.get("error")) || isCalibrating(model));
  const showError = () => {
    const msg = model.get("error") ?? "";
    out.error.textContent = msg ? `${msg}. Showing the last valid result.` : "";
    out.error.hidden = !msg;
    markStale();
    syncAll();
  };
  const onCalibration = () => {
    showCalibration(out.calibrating, model);
    markStale();
  };
  const showResult = () => {
    const result = readTrait(model, "result") ?? {};
    renderResult(doc, out.result, result);
    showScalingPending(out.charts.blocks.scaling, out.scalingNote, result);
  };
  wireCompare(ctx, out.compare);
  onModel("scenario_data", syncAll);
  const fit = wireFit(ctx, out.fit);
  const trace = wireTrace(ctx, out.trace);
  const showBlocks = () => showChartBlocks(out.charts.blocks, readTrait(model, "charts"));
  onModel("charts", showBlocks);
  const charts = drawCharts(ctx, out.charts.els, () => readTrait(model, "charts"), ["charts"]);
  wireImageButtons(ctx, out.charts.buttons, charts);
  onModel("headroom", syncAll);
  onModel("error", showError);
  onModel("calibration", onCalibration);
  onModel("error_field", syncAll);
  onModel("result", showResult);
  onModel("options", () => {
    controls.update();
    syncAll();
  });
  wireExport(ctx, out.export)();
  wireImport(ctx, out.import)();
  wireMeasure(ctx, out.measure)();
  showError();
  onCalibration();
  showResult();
  trace.show();
  fit.show();
  fit.layouts.show();
  showBlocks();
  charts();
  trace.draw();
  fit.layouts.draw();
  return () => {
    ctx.dispose();
    el.replaceChildren();
  };
}
var index_default = { render };
export {
  index_default as default,
  render
};
