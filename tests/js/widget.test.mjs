import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, test } from "node:test";

import { afterPaint, deps } from "../../js/src/charts.js";
import { applyControl, controlForField, ctlClass, logIndex } from "../../js/src/controls.js";
import { fmtBytes, fmtPct, rowsToCsv } from "../../js/src/format.js";
import { render } from "../../js/src/index.js";
import { getPath, setPath } from "../../js/src/state.js";
import { errorClass, rankLine, traceProgressText } from "../../js/src/trace.js";
import { fakeModel, fire, fixtureState, makeDom, traceFixture } from "./fake-model.mjs";

const realLoad = deps.loadVegaEmbed;
/** The controls as Python sends them (`options.controls`). */
const CONTROLS = fixtureState().options.controls;
let env;

function mount(overrides = {}) {
  const { doc, el, window } = makeDom();
  const model = fakeModel({ ...fixtureState(), ...overrides });
  const cleanup = render({ model, el });
  const q = (sel) => el.querySelector(sel);
  const ctl = (key) => q(`.${ctlClass(key)}`);
  env = { doc, el, window, model, cleanup, q, ctl };
  return env;
}

/** Wait (up to 2 s) until `cond()` holds: charts are drawn asynchronously, one per frame. */
async function until(cond) {
  for (let i = 0; i < 200 && !cond(); i++) await new Promise((r) => setTimeout(r, 10));
}

beforeEach(() => {
  deps.loadVegaEmbed = async () => null;
});

afterEach(() => {
  deps.loadVegaEmbed = realLoad;
  env = undefined;
});

describe("pure helpers", () => {
  test("getPath/setPath read and copy dotted keys without mutating", () => {
    const s = { parallel: { tp: 1, dp: 2 }, model: "gpt2" };
    const t = setPath(s, "parallel.tp", 4);
    assert.equal(getPath(t, "parallel.tp"), 4);
    assert.equal(s.parallel.tp, 1);
    assert.equal(getPath(s, "model.hidden_size"), undefined);
    assert.deepEqual(setPath({}, "lora.rank", 8), { lora: { rank: 8 } });
  });

  test("logIndex picks the largest stop not above the value", () => {
    const stops = [1, 2, 4, 8, 16];
    assert.equal(logIndex(stops, 1), 0);
    assert.equal(logIndex(stops, 8), 3);
    assert.equal(logIndex(stops, 12), 3);
    assert.equal(logIndex(stops, 4096), 4);
    assert.equal(logIndex(stops, 0), 0);
  });

  test("fmtBytes matches Python's fmt_bytes", () => {
    assert.equal(fmtBytes(1024 ** 3 * 14.96), "14.96 GiB");
    assert.equal(fmtBytes(3 * 1024 ** 2), "3.00 MiB");
    assert.equal(fmtBytes(512), "512 B");
  });

  test("controlForField maps error fields to controls", () => {
    const { options } = fixtureState();
    assert.equal(controlForField("parallel.tp", options), "parallel.tp");
    assert.equal(controlForField("model.n_head", options), "model");
    assert.equal(controlForField("model.hidden_size", options), "model.hidden_size");
    assert.equal(controlForField("num_gpus", options), "parallel.dp");
    assert.equal(controlForField("lora.targets", options), "lora.targets");
    assert.equal(controlForField("scenario", options), null);
    assert.equal(controlForField("", options), null);
  });

  test("rowsToCsv quotes commas and quotes", () => {
    const csv = rowsToCsv([{ rank: "rank 0", item: 'a "b"', formula: "1,024 x 2 B", bytes: 5 }], ["rank", "item", "formula", "bytes"]);
    assert.equal(csv, 'rank,item,formula,bytes\nrank 0,"a ""b""","1,024 x 2 B",5\n');
  });

  test("applyControl builds custom model and GPU dicts", () => {
    const { scenario_data: s, options } = fixtureState();
    const custom = applyControl(s, "model", "custom", options);
    assert.equal(custom.model.model_type, "llama");
    assert.equal(custom.model.hidden_size, options.model_dims.hidden_size);
    assert.equal(typeof s.model, "string", "input not mutated");
    const gpu = applyControl(s, "gpu", "custom", options);
    // a custom card starts from the current card's capacity as the driver reports it (79.2 GiB for an H100 SXM)
    const current = options.gpus.find((g) => g.id === s.gpu).memory_gib;
    assert.deepEqual(gpu.gpu, { memory_gib: current });
    assert.equal(applyControl(s, "model", " gpt2 ", options).model, "gpt2");
    const dim = applyControl(custom, "model.num_hidden_layers", 4, options);
    assert.equal(dim.model.num_hidden_layers, 4);
    assert.equal(dim.model.hidden_size, options.model_dims.hidden_size);
  });
});

describe("render", () => {
  test("creates every control with its class and suppresses JupyterLab shortcuts", () => {
    const { el, ctl, cleanup } = mount();
    for (const { key } of CONTROLS) assert.ok(ctl(key), `control ${key}`);
    const focusables = el.querySelectorAll("input, select, textarea, button");
    assert.ok(focusables.length > CONTROLS.length);
    for (const f of focusables) assert.equal(f.getAttribute("data-lm-suppress-shortcuts"), "true", f.className);
    assert.ok(el.querySelectorAll("datalist option").length > 10, "preset datalist");
    assert.equal(ctl("model").value, "llama-3.1-8b");
    assert.equal(ctl("gpu").value, "h100-sxm-80gb");
    cleanup();
  });

  test("shows scenario values, log sliders and the verdict", () => {
    const { q, ctl, model, cleanup } = mount();
    const stops = model.get("options").stops.seq_len;
    assert.equal(ctl("seq_len").value, String(stops.indexOf(2048)));
    assert.equal(ctl("seq_len").parentElement.querySelector("output").textContent, "2048");
    assert.equal(ctl("micro_batch_size").value, "0");
    assert.equal(ctl("headroom").value, "10");
    assert.match(q(".memsim-verdict-word").textContent, /fits|tight|does not fit/);
    assert.ok(q(".memsim-peak-allocated").textContent.includes("torch.cuda.max_memory_allocated()"));
    assert.equal(q(".memsim-table tbody").children.length, model.get("result").rows.length);
    assert.match(decodeURIComponent(q(".memsim-csv").href), /rank,stage,moment,category,item,bytes,gib,counter,formula/);
    assert.ok(JSON.parse(q(".memsim-json").value).model, "scenario JSON shown");
    cleanup();
  });

  test("caveats sent with the result show beside the verdict, none when there are none", () => {
    const plain = mount();
    assert.equal(plain.el.querySelectorAll(".memsim-caveat").length, 0);
    plain.cleanup();
    const result = { ...fixtureState().result, caveats: ["compile: untraced for this scenario, a formula"] };
    const { el, cleanup } = mount({ result });
    const shown = [...el.querySelectorAll(".memsim-verdict .memsim-caveat")].map((c) => c.textContent);
    assert.deepEqual(shown, ["caveat: compile: untraced for this scenario, a formula"]);
    cleanup();
  });

  test("under the replay the verdict panel says what the replay on the card found, nothing without it", () => {
    // the fixture's default scenario is replayed; the fitted rule sends no verdict_text
    const fitted = { ...fixtureState().result, verdict_reason: "", verdict_text: "" };
    const plain = mount({ result: fitted });
    assert.equal(plain.el.querySelectorAll(".memsim-verdict-replay").length, 0);
    plain.cleanup();
    const runs = mount();
    assert.equal(runs.q(".memsim-verdict-replay").textContent, fixtureState().result.verdict_text);
    runs.cleanup();
    const text = "replayed on the card (4.96 GiB for PyTorch): out of memory from fragmentation: 8.31 MiB asked, " +
      "the free bytes would hold it but the largest free range is 6.00 MiB (at step 1 optimizer step)";
    const result = { ...fixtureState().result, verdict: "does not fit", verdict_reason: "fragmentation", verdict_text: text };
    const { q, cleanup } = mount({ result });
    assert.equal(q(".memsim-verdict .memsim-verdict-replay").textContent, text);
    assert.ok(q(".memsim-verdict-replay").classList.contains("memsim-verdict-replay-fragmentation"));
    cleanup();
  });

  test("with several pipeline stages each headline peak names its stage, none with one", () => {
    const plain = mount();
    assert.equal(plain.el.querySelectorAll(".memsim-peak-rank").length, 0);
    plain.cleanup();
    const base = fixtureState().result;
    const peaks = base.peaks.map((p) => ({ ...p, rank: p.key === "peak_allocated_bytes" ? "stage 0" : "stage 2" }));
    const per_rank = [0, 1, 2, 3].map((i) => ({ ...base.per_rank[0], rank: `stage ${i}`, stage: i }));
    const { q, cleanup } = mount({ result: { ...base, peaks, per_rank } });
    assert.match(q(".memsim-peak-allocated").textContent, / on stage 0 predicts /);
    assert.match(q(".memsim-peak-nvidia-smi").textContent, / on stage 2 predicts /);
    cleanup();
  });

  test("moving a slider writes the scenario back and saves", () => {
    const { window, ctl, model, cleanup } = mount();
    const before = model.get("scenario_data");
    const slider = ctl("micro_batch_size");
    slider.value = "3";
    fire(window, slider, "input");
    assert.equal(slider.parentElement.querySelector("output").textContent, "8");
    assert.equal(model.saves, 0, "input only updates the label");
    fire(window, slider, "change");
    assert.equal(model.saves, 1);
    const after = model.get("scenario_data");
    assert.equal(after.micro_batch_size, 8);
    assert.notEqual(after, before, "a new object, so the change is seen");
    assert.equal(before.micro_batch_size, 1, "old state not mutated");
    assert.deepEqual({ ...after, micro_batch_size: 1 }, before);
    cleanup();
  });

  test("number, select, checkbox and headroom controls write their values", () => {
    const { window, ctl, model, cleanup } = mount();
    const tp = ctl("parallel.tp");
    tp.value = "2";
    fire(window, tp, "change");
    assert.equal(model.get("scenario_data").parallel.tp, 2);
    const zero = ctl("parallel.zero");
    zero.value = "3";
    fire(window, zero, "change");
    assert.strictEqual(model.get("scenario_data").parallel.zero, 3, "numeric choice stays a number");
    const opt = ctl("optimizer");
    opt.value = "sgd";
    fire(window, opt, "change");
    assert.equal(model.get("scenario_data").optimizer, "sgd");
    const head = ctl("headroom");
    head.value = "20";
    fire(window, head, "change");
    assert.equal(model.get("headroom"), 0.2);
    const bad = ctl("grad_accum_steps");
    bad.value = "";
    fire(window, bad, "change");
    assert.equal(model.saves, 4, "an empty number is not sent");
    cleanup();
  });

  test("the output lifetime select offers the unset choice, shown for a scenario without the key", () => {
    const { window, ctl, model, cleanup } = mount();
    const sel = ctl("output_lifetime");
    assert.equal(model.get("scenario_data").output_lifetime, undefined, "the fixture leaves it unset");
    assert.equal(sel.value, "", "the unset choice is selected");
    assert.equal(sel.options[0].textContent, "framework's own");
    sel.value = "step";
    fire(window, sel, "change");
    assert.equal(model.get("scenario_data").output_lifetime, "step");
    sel.value = "";
    fire(window, sel, "change");
    assert.strictEqual(model.get("scenario_data").output_lifetime, null, "back to unset: null, not ''");
    cleanup();
  });

  test("custom model and GPU enable their dimension inputs through options", () => {
    const { window, ctl, model, cleanup } = mount();
    assert.equal(ctl("model.hidden_size").disabled, true);
    assert.equal(ctl("model.hidden_size").value, String(model.get("options").model_dims.hidden_size));
    const m = ctl("model");
    m.value = "custom";
    fire(window, m, "change");
    assert.equal(model.get("scenario_data").model.model_type, "llama");
    const opts = structuredClone(model.get("options"));
    for (const k of Object.keys(opts.disabled)) if (k.startsWith("model.")) delete opts.disabled[k];
    model.set("options", opts);
    assert.equal(ctl("model.hidden_size").disabled, false);
    assert.equal(ctl("model").value, "custom");
    const layers = ctl("model.num_hidden_layers");
    layers.value = "6";
    fire(window, layers, "change");
    assert.equal(model.get("scenario_data").model.num_hidden_layers, 6);
    const gpu = ctl("gpu");
    gpu.value = "custom";
    fire(window, gpu, "change");
    const h100 = model.get("options").gpus.find((g) => g.id === "h100-sxm-80gb").memory_gib;
    assert.equal(model.get("scenario_data").gpu.memory_gib, h100);
    cleanup();
  });

  test("disabled state and disabled values follow options", () => {
    const { window, ctl, model, cleanup } = mount();
    const rank = ctl("lora.rank");
    assert.equal(rank.disabled, true);
    assert.match(rank.closest("label").title, /lora or qlora/);
    assert.ok(rank.closest("label").classList.contains("memsim-disabled"));
    for (const box of ctl("lora.targets").querySelectorAll("input")) assert.equal(box.disabled, true);
    assert.equal(ctl("parallel.sequence_parallel").disabled, true);
    assert.equal(ctl("parallel.offload").disabled, true);
    assert.equal(ctl("micro_batch_size").disabled, false);

    const opts = structuredClone(model.get("options"));
    delete opts.disabled["lora.rank"];
    delete opts.disabled["lora.targets"];
    opts.disabled_values = { optimizer_impl: ["foreach", "for-loop"] };
    model.set("options", opts);
    assert.equal(rank.disabled, false);
    assert.equal(rank.closest("label").title, "");
    for (const box of ctl("lora.targets").querySelectorAll("input")) assert.equal(box.disabled, false);
    const impl = [...ctl("optimizer_impl").options];
    assert.deepEqual(impl.filter((o) => o.disabled).map((o) => o.value), ["foreach", "for-loop"]);
    assert.equal(impl.find((o) => o.value === "fused").disabled, false);

    const box = [...ctl("lora.targets").querySelectorAll("input")].find((b) => b.value === "k_proj");
    box.checked = true;
    fire(window, box, "change");
    assert.deepEqual(model.get("scenario_data").lora.targets, ["k_proj", "q_proj", "v_proj"]);
    cleanup();
  });

  test("an error shows in place, marks the field, and keeps the last result", () => {
    const { q, ctl, model, cleanup } = mount();
    const verdictBefore = q(".memsim-verdict").textContent;
    assert.equal(q(".memsim-error").hidden, true);
    model.set("scenario_data", setPath(model.get("scenario_data"), "parallel.tp", 3));
    model.set("error_field", "parallel.tp");
    model.set("error", "parallel.tp: 32 attention heads are not divisible by tp=3");
    const err = q(".memsim-error");
    assert.equal(err.hidden, false);
    assert.match(err.textContent, /parallel\.tp: 32 attention heads/);
    assert.ok(ctl("parallel.tp").closest("label").classList.contains("memsim-invalid"));
    assert.equal(ctl("parallel.tp").getAttribute("aria-invalid"), "true");
    assert.equal(ctl("parallel.tp").value, "3", "the typed value stays visible");
    assert.ok(q(".memsim-output").classList.contains("memsim-stale"));
    assert.equal(q(".memsim-verdict").textContent, verdictBefore, "previous result still shown");
    model.set("error_field", "");
    model.set("error", "");
    assert.equal(q(".memsim-error").hidden, true);
    assert.equal(ctl("parallel.tp").closest("label").classList.contains("memsim-invalid"), false);
    cleanup();
  });

  test("apply JSON sends the parsed scenario; bad JSON shows an error", () => {
    const { window, q, model, cleanup } = mount();
    const area = q(".memsim-json");
    area.value = JSON.stringify({ model: "gpt2" });
    fire(window, q(".memsim-apply"), "click");
    assert.deepEqual(model.get("scenario_data"), { model: "gpt2" });
    assert.equal(model.saves, 1);
    area.value = "{ nope";
    fire(window, q(".memsim-apply"), "click");
    assert.equal(q(".memsim-error").hidden, false);
    assert.match(q(".memsim-error").textContent, /scenario JSON/);
    assert.equal(model.saves, 1);
    cleanup();
  });

  test("charts are embedded with vega-embed and re-embedded on change", async () => {
    const calls = [];
    let finalized = 0;
    deps.loadVegaEmbed = async (src) => {
      assert.equal(src, "bundle");
      return async (el, spec, opts) => {
        calls.push({ cls: el.className, spec, opts });
        el.textContent = "drawn";
        return { view: { toImageURL: async () => "data:," }, finalize: () => finalized++ };
      };
    };
    const { q, model, cleanup } = mount({ _vega_js: "bundle" });
    await until(() => calls.length >= 2);
    assert.equal(calls.length, 2);
    assert.ok(calls[0].cls.includes("memsim-chart-breakdown"));
    assert.deepEqual(calls[0].spec, model.get("charts").breakdown);
    assert.equal(calls[0].opts.actions, false);
    assert.equal(q(".memsim-chart-scaling").textContent, "drawn");
    model.set("charts", { breakdown: { mark: "bar" }, scaling: { mark: "area" } });
    await until(() => calls.length >= 4);
    assert.equal(calls.length, 4);
    assert.equal(finalized, 2, "previous views finalized");
    model.set("charts", { breakdown: { mark: "bar" }, scaling: { mark: "line" } });
    await until(() => calls.length >= 5);
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(calls.length, 5, "an unchanged chart is not embedded again");
    assert.equal(calls[4].spec.mark, "line");
    cleanup();
    assert.equal(finalized, 5, "cleanup finalizes the views");
  });

  test("without the vega bundle the charts say why", async () => {
    const { q, cleanup } = mount();
    await new Promise((r) => setTimeout(r, 5));
    assert.match(q(".memsim-chart-breakdown").textContent, /vl-convert/);
    cleanup();
  });

  test("options, result and charts also arrive as JSON text (how Python sends them)", async () => {
    const state = fixtureState();
    const embedded = [];
    deps.loadVegaEmbed = async () => async (el, spec) => {
      embedded.push(spec);
      return { view: {}, finalize() {} };
    };
    const { q, ctl, model, cleanup } = mount({
      options: JSON.stringify(state.options),
      result: JSON.stringify(state.result),
      charts: JSON.stringify(state.charts),
      _vega_js: "bundle",
    });
    assert.equal(ctl("lora.rank").disabled, true);
    assert.equal(q(".memsim-table tbody").children.length, state.result.rows.length);
    await until(() => embedded.length >= 1);
    assert.deepEqual(embedded[0], state.charts.breakdown);
    const opts = structuredClone(state.options);
    delete opts.disabled["lora.rank"];
    model.set("options", JSON.stringify(opts));
    assert.equal(ctl("lora.rank").disabled, false);
    cleanup();
  });

  test("cleanup removes every listener", () => {
    const { window, el, ctl, model, cleanup } = mount();
    assert.ok(model.listenerCount() > 0);
    const slider = ctl("micro_batch_size");
    cleanup();
    assert.equal(model.listenerCount(), 0);
    assert.equal(el.children.length, 0);
    slider.value = "2";
    fire(window, slider, "change");
    assert.equal(model.saves, 0, "detached controls do nothing");
  });
});

describe("verify with trace", () => {
  const traceState = (changes = {}) => ({ ...fixtureState().trace, ...changes });

  test("a multi-GPU trace names the traced rank and the simulated stage in the headline", () => {
    const { trace, trace_view: view } = traceFixture();
    const rank = { index: 3, world_size: 8, role: "rank 3 of 8: FSDP shard 3 of 8", simulated_stage: 0,
      simulated_role: "each of 8 GPUs (all 4 layers)" };
    const { q, model, cleanup } = mount({ trace });
    model.set("trace_view", JSON.stringify({ ...view, summary: { ...view.summary, rank } }));
    assert.equal(q(".memsim-trace-rank").textContent,
      "traced rank 3 of 8: FSDP shard 3 of 8 (simulated: each of 8 GPUs (all 4 layers))");
    assert.match(q(".memsim-trace-headline").textContent, /traced peak 2\.86 MiB/);
    model.set("trace_view", JSON.stringify(view));
    assert.equal(q(".memsim-trace-rank"), null, "a one-GPU trace shows no rank line");
    cleanup();
  });

  test("rankLine is empty for one GPU", () => {
    const { doc } = makeDom();
    assert.deepEqual(rankLine(doc, { index: 0, world_size: 1, role: "" }), []);
    assert.deepEqual(rankLine(doc, undefined), []);
  });

  test("pure helpers: progress line, signed percent, error class", () => {
    assert.equal(traceProgressText({ stage: "importing torch", elapsed_s: 1.25 }), "importing torch · 1.3 s");
    assert.equal(
      traceProgressText({ stage: "tracing", step: 2, steps: 2, phase: "backward", ops: 12345, live_bytes: 3 * 1024 ** 2,
        peak_bytes: 4 * 1024 ** 2, elapsed_s: 7 }),
      "step 2/2: backward · 12,345 ops · 3.00 MiB live · peak so far 4.00 MiB · 7.0 s",
    );
    assert.equal(traceProgressText({ stage: "tracing", step: 0, phase: "setup", ops: 0 }), "setup · 0 ops");
    assert.equal(fmtPct(1.234), "+1.23%");
    assert.equal(fmtPct(-0.5), "-0.50%");
    assert.equal(fmtPct(null), "n/a");
    assert.equal(errorClass(1.9), "memsim-err-ok");
    assert.equal(errorClass(-4), "memsim-err-warn");
    assert.equal(errorClass(7.5), "memsim-err-bad");
  });

  test("the button sends verify; while running it shows progress and sends cancel", () => {
    const { window, q, model, cleanup } = mount();
    const btn = q(".memsim-ctl-verify");
    assert.equal(btn.tagName, "BUTTON");
    assert.equal(btn.textContent, "Verify with trace");
    assert.equal(btn.disabled, false);
    assert.match(btn.title, /fake tensors/);
    assert.equal(btn.getAttribute("data-lm-suppress-shortcuts"), "true");
    assert.equal(q(".memsim-trace-result").hidden, true, "nothing traced yet");
    assert.equal(q(".memsim-trace-running").hidden, true);
    fire(window, btn, "click");
    assert.deepEqual(model.sent, [{ type: "verify" }]);
    assert.equal(model.saves, 0, "a message, not a trait write");

    model.set("trace", traceState({ state: "running", progress: { stage: "importing torch", elapsed_s: 0.5, steps: 2 } }));
    assert.equal(btn.textContent, "Cancel trace");
    assert.equal(btn.disabled, false);
    assert.equal(q(".memsim-trace-running").hidden, false);
    assert.equal(q(".memsim-trace-progress").hasAttribute("value"), false, "indeterminate before step 2");
    assert.match(q(".memsim-trace-progress-text").textContent, /importing torch · 0\.5 s/);
    assert.equal(q(".memsim-trace-status").textContent, "tracing…");
    model.set("trace", traceState({ state: "running", progress: { stage: "tracing", step: 2, steps: 2, phase: "backward",
      ops: 900, live_bytes: 1024 ** 3, peak_bytes: 2 * 1024 ** 3, elapsed_s: 3.2, fraction: 0.75 } }));
    assert.equal(q(".memsim-trace-progress").value, 0.75);
    assert.match(q(".memsim-trace-progress-text").textContent, /step 2\/2: backward · 900 ops · 1\.00 GiB live/);
    fire(window, btn, "click");
    assert.deepEqual(model.sent.at(-1), { type: "cancel" });

    model.set("trace", traceState({ state: "cancelling", progress: { stage: "tracing", elapsed_s: 3.4 } }));
    assert.equal(btn.disabled, true);
    assert.equal(btn.textContent, "Cancelling…");
    model.set("trace", traceState({ state: "cancelled", progress: { stage: "finished", elapsed_s: 3.5 } }));
    assert.equal(btn.disabled, false);
    assert.equal(btn.textContent, "Verify with trace");
    assert.equal(q(".memsim-trace-running").hidden, true);
    assert.equal(q(".memsim-trace-status").textContent, "trace cancelled");
    model.set("trace", traceState({ state: "error", error: "RuntimeError: boom" }));
    assert.match(q(".memsim-trace-status").textContent, /trace failed: RuntimeError: boom/);
    cleanup();
  });

  test("disabled, not hidden, with the reason as tooltip and text", () => {
    const reason = "method: qlora cannot be traced: bitsandbytes' 4-bit kernels need CUDA";
    const { window, q, model, cleanup } = mount({ trace: traceState({ available: false, reason }) });
    const btn = q(".memsim-ctl-verify");
    assert.equal(btn.disabled, true);
    assert.equal(btn.hidden, false);
    assert.equal(btn.title, reason);
    assert.equal(q(".memsim-trace-reason").hidden, false);
    assert.match(q(".memsim-trace-reason").textContent, /qlora cannot be traced/);
    assert.ok(q(".memsim-trace").classList.contains("memsim-trace-off"));
    fire(window, btn, "click");
    assert.deepEqual(model.sent, [], "a disabled button sends nothing");
    model.set("trace", traceState({ available: false, reason: "trace: needs torch: pip install 'memsim-widget[trace]'" }));
    assert.match(btn.title, /pip install 'memsim-widget\[trace\]'/);
    model.set("trace", traceState());
    assert.equal(btn.disabled, false);
    assert.equal(q(".memsim-trace-reason").hidden, true);
    cleanup();
  });

  test("a finished trace shows traced vs simulated, per category and both charts", async () => {
    const embedded = [];
    deps.loadVegaEmbed = async () => async (el, spec) => {
      embedded.push({ cls: el.className, spec });
      el.textContent = "drawn";
      return { view: {}, finalize() {} };
    };
    const { trace, trace_view: view } = traceFixture();
    const { q, model, cleanup } = mount({ _vega_js: "bundle" });
    await until(() => embedded.length >= 2);
    assert.equal(embedded.length, 2, "only the estimate's charts before a trace");
    model.set("trace", trace);
    model.set("trace_view", JSON.stringify(view));
    assert.equal(q(".memsim-trace-result").hidden, false);
    const head = q(".memsim-trace-headline").textContent;
    assert.match(head, /traced peak 2\.86 MiB at backward \(step 2, mm\)/);
    assert.match(head, /simulated 2\.92 MiB at backward_start/);
    assert.equal(q(".memsim-trace-error").textContent, "+2.00%");
    assert.ok(q(".memsim-trace-error").classList.contains("memsim-err-ok"));
    const rows = [...q(".memsim-trace-table tbody").children].map((tr) => [...tr.children].map((td) => td.textContent));
    assert.deepEqual(rows.map((r) => r[0]), ["parameters", "optimizer_states", "activations"]);
    assert.deepEqual(rows[2].slice(3), ["+7.50%"]);
    assert.match(q(".memsim-trace-status").textContent, /traced in 1\.5 s \(1,231 ops\)/);
    assert.equal(q(".memsim-trace-stale-label").hidden, true);
    await until(() => embedded.length >= 4);
    const drawn = embedded.slice(2);
    assert.ok(drawn[0].cls.includes("memsim-chart-trace-comparison"));
    assert.ok(drawn[1].cls.includes("memsim-chart-trace-timeline"));
    assert.deepEqual(drawn[1].spec, view.charts.timeline);
    assert.match(q(".memsim-trace-notes summary").textContent, /trace notes \(1\)/);
    model.set("trace", { ...trace, progress: { ...trace.progress, elapsed_s: 1.6 } });
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(embedded.length, 4, "a trace update without a new view redraws no chart");
    cleanup();
  });

  test("a finished trace holds allocated, reserved and nvidia-smi: replayed against simulated", () => {
    const { trace, trace_view: view } = traceFixture();
    const counters = [
      { counter: "allocated", traced: 2097152, simulated: 2097152, error_pct: 0 },
      { counter: "reserved", traced: 4194304, simulated: 5242880, error_pct: 25 },
    ];
    const { q, model, cleanup } = mount({});
    model.set("trace", trace);
    const onCard = "replayed on the card (139.00 GiB for PyTorch): runs";
    model.set("trace_view", JSON.stringify({ ...view, summary: { ...view.summary, counters, on_card: onCard } }));
    assert.equal(q(".memsim-trace-on-card").textContent, onCard);
    const rows = [...q(".memsim-trace-counters tbody").children].map((tr) => [...tr.children].map((td) => td.textContent));
    assert.deepEqual(rows, [["allocated", "2.00 MiB", "2.00 MiB", "0.00%"], ["reserved", "4.00 MiB", "5.00 MiB", "+25.00%"]]);
    model.set("trace_view", JSON.stringify(view));
    assert.equal(q(".memsim-trace-counters"), null, "no replay, no counters table");
    cleanup();
  });

  test("a trace of another scenario stays visible, dimmed and labelled stale", () => {
    const { trace, trace_view: view } = traceFixture();
    const { q, model, cleanup } = mount({ trace, trace_view: view });
    const result = q(".memsim-trace-result");
    assert.equal(result.classList.contains("memsim-trace-stale"), false);
    model.set("trace", { ...trace, stale: true, stale_keys: ["micro_batch_size", "seq_len"] });
    assert.equal(result.hidden, false, "kept visible");
    assert.ok(result.classList.contains("memsim-trace-stale"));
    const label = q(".memsim-trace-stale-label");
    assert.equal(label.hidden, false);
    assert.match(label.textContent, /^Stale: traced for another scenario \(micro_batch_size, seq_len changed since\)/);
    assert.match(q(".memsim-trace-headline").textContent, /traced peak/, "the numbers stay readable");
    model.set("trace", { ...trace, state: "running", stale: true, stale_keys: ["seq_len"], running_stale: true,
      progress: { stage: "tracing", step: 1, phase: "forward", ops: 3 } });
    assert.match(q(".memsim-trace-status").textContent, /as it was when you clicked/);
    model.set("trace", { ...trace, stale: false, stale_keys: [] });
    assert.equal(result.classList.contains("memsim-trace-stale"), false);
    assert.equal(label.hidden, true);
    cleanup();
  });
});

describe("module loading", () => {
  test("importFromSource imports ES module text (data: URL outside browsers) and caches it", async () => {
    const { importFromSource } = await import("../../js/src/charts.js");
    const src = "export const vegaEmbed = (x) => x * 2;";
    const mod = await importFromSource(src);
    assert.equal(mod.vegaEmbed(21), 42);
    assert.equal(await importFromSource(src), mod);
    const embed = await realLoad(src);
    assert.equal(embed(2), 4);
    assert.equal(await realLoad(""), null);
  });
});

describe("afterPaint", () => {
  test("waits for the next frame, then a task; resolves without frames (node) or when none come (hidden tab)", async () => {
    const frames = [];
    const win = { requestAnimationFrame: (fn) => frames.push(fn) };
    let done = false;
    const p = afterPaint(win).then(() => (done = true));
    await new Promise((r) => setTimeout(r, 5));
    assert.equal(done, false, "not before the frame");
    frames.shift()();
    await p;
    assert.equal(done, true);
    await afterPaint(undefined);
    await afterPaint({ requestAnimationFrame: () => {} }); // a hidden tab: the timer resolves it
  });
});

describe("objective controls and the phase chart", () => {
  test("the objective select offers sft unset, writes the key, and the rl knobs write the rl block", () => {
    const { window, ctl, model, cleanup } = mount();
    const sel = ctl("objective");
    assert.equal(sel.value, "", "the fixture is SFT (no objective key)");
    assert.equal(sel.options[0].textContent, "sft (unset)");
    sel.value = "grpo";
    fire(window, sel, "change");
    assert.equal(model.get("scenario_data").objective, "grpo");
    const g = ctl("rl.num_generations");
    assert.ok(g, "the G control exists");
    g.value = "4";
    fire(window, g, "change");
    assert.equal(model.get("scenario_data").rl.num_generations, 4);
    const sleep = ctl("rl.sleep_mode");
    sleep.value = "1";
    fire(window, sleep, "change");
    assert.strictEqual(model.get("scenario_data").rl.sleep_mode, 1, "a numeric choice is sent as a number");
    cleanup();
  });

  test("the phase chart block shows only when Python sends a phases chart", () => {
    const { q, model, cleanup } = mount();
    const block = q(".memsim-block-phases");
    assert.ok(block.hidden, "hidden for SFT");
    model.set("charts", { ...model.get("charts"), phases: { mark: "bar" } });
    assert.ok(!block.hidden, "shown for an RL objective");
    const { phases, ...rest } = model.get("charts");
    assert.ok(phases);
    model.set("charts", rest);
    assert.ok(block.hidden, "hidden again");
    cleanup();
  });
});
