// "Make it fit" and "Layouts" in jsdom: the toggle writes `fit_open`, the panel draws `fit` and `layouts` as
// Python sends them (tests/js/fixtures/plan.json), and Apply / Search send the messages Python handles.
import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, test } from "node:test";

import { deps } from "../../js/src/charts.js";
import { fmtGiB } from "../../js/src/format.js";
import { render } from "../../js/src/index.js";
import { knobsText, layoutText } from "../../js/src/layouts.js";
import { fakeModel, fire, fixtureState, makeDom, planFixture } from "./fake-model.mjs";

const realLoad = deps.loadVegaEmbed;

function mount(overrides = {}) {
  const { doc, el, window } = makeDom();
  const model = fakeModel({ ...fixtureState(), ...overrides });
  const cleanup = render({ model, el });
  const q = (sel) => el.querySelector(sel);
  const qa = (sel) => [...el.querySelectorAll(sel)];
  return { doc, el, window, model, cleanup, q, qa };
}

/** Wait (up to 2 s) until `cond()` holds: charts are drawn asynchronously. */
async function until(cond) {
  for (let i = 0; i < 200 && !cond(); i++) await new Promise((r) => setTimeout(r, 10));
}

beforeEach(() => {
  deps.loadVegaEmbed = async () => null;
});

afterEach(() => {
  deps.loadVegaEmbed = realLoad;
});

describe("make it fit", () => {
  test("pure helpers: GiB with two decimals, the layout in use", () => {
    assert.equal(fmtGiB(49.756), "49.76 GiB");
    assert.equal(fmtGiB(undefined), "0.00 GiB");
    // Python marks the layout in use (tests/widget/test_widget_plan.py checks the rule): none before Apply, the
    // applied one after.
    const { layouts } = planFixture().layouts;
    const row = layouts.view.top[0];
    assert.equal(row.current, false);
    const applied = planFixture().applied.layouts.view.top;
    assert.equal(applied[0].candidate, row.candidate);
    assert.equal(applied[0].current, true);
    assert.equal(layoutText({ layout: "dp=4 tp=2 pp=1 cp=1", zero: 1, sequence_parallel: true }), "dp=4 tp=2 pp=1 cp=1, ZeRO-1, sp");
    assert.equal(knobsText({ activation_checkpointing: "none", loss: "chunked", optimizer: "adamw-8bit", offload: "none" }),
      "no ckpt, chunked loss, adamw-8bit");
    assert.equal(knobsText({ activation_checkpointing: "full", loss: "standard", optimizer: "adamw", offload: "optimizer" }),
      "full ckpt, standard loss, adamw, offload optimizer");
  });

  test("closed until the toggle writes fit_open; it computes nothing itself", () => {
    const { window, q, model, cleanup } = mount();
    const toggle = q(".memsim-fit-toggle");
    assert.equal(toggle.textContent, "Make it fit");
    assert.equal(toggle.getAttribute("aria-expanded"), "false");
    assert.equal(toggle.getAttribute("data-lm-suppress-shortcuts"), "true");
    assert.equal(q(".memsim-fit-body").hidden, true);
    fire(window, toggle, "click");
    assert.equal(model.get("fit_open"), true);
    assert.equal(model.saves, 1);
    assert.deepEqual(model.sent, [], "opening is a trait write; Python computes");
    assert.equal(q(".memsim-fit-body").hidden, false);
    assert.equal(toggle.getAttribute("aria-expanded"), "true");
    model.set("fit", { ...model.get("fit"), state: "running" });
    assert.equal(q(".memsim-fit-status").textContent, "finding what fits…");
    assert.equal(q(".memsim-fit-result").hidden, true, "nothing to show yet");
    fire(window, toggle, "click");
    assert.equal(model.get("fit_open"), false);
    assert.equal(q(".memsim-fit-body").hidden, true);
    cleanup();
  });

  test("a scenario that does not fit lists the fixing changes; Apply sends the entry and the result id", () => {
    const { scenario_data, fit } = planFixture().too_big;
    const { window, q, qa, model, cleanup } = mount({ scenario_data, fit, fit_open: true });
    assert.match(q(".memsim-fit-headline").textContent, /^does not fit: .* per GPU, .* usable on NVIDIA A100 .*Smallest changes that fit:/);
    const rows = qa(".memsim-fit-table-change tbody tr");
    assert.equal(rows.length, fit.view.changes.length);
    const cells = [...rows[0].children].map((td) => td.textContent);
    const first = fit.view.changes[0];
    const tag = first.changes_the_job ? " changes the job" : "";
    assert.match(cells[0], new RegExp(`^${first.label.replace(/[+()]/g, "\\$&")}${tag}$`));
    assert.equal(cells[1], fmtGiB(first.saved_gib));
    assert.equal(cells[3], "yes");
    assert.equal(cells[4], first.cost);
    assert.equal(q(".memsim-fit-status").textContent, "computed in 42 ms");
    assert.ok(q(".memsim-fit-levers details"), "single levers collapsed under the fixes");
    const mg = fit.view.min_gpus;
    assert.match(q(".memsim-fit-facts").textContent,
      mg ? new RegExp(`fewest GPUs that fit: ${mg.num_gpus} \\(dp=${mg.dp}`) : /more GPUs alone do not make it fit/);
    assert.match(q(".memsim-fit-facts").textContent, /smallest card that holds it as it is: |no card in the catalog/);
    const apply = rows[0].querySelector(".memsim-fit-apply");
    assert.equal(apply.disabled, false);
    fire(window, apply, "click");
    assert.deepEqual(model.sent, [{ type: "fit_apply", kind: "change", index: 0, id: fit.id }]);
    assert.equal(apply.disabled, true);
    assert.equal(apply.textContent, "Applying…");
    fire(window, apply, "click");
    assert.equal(model.sent.length, 1, "a disabled button sends nothing");
    cleanup();
  });

  test("when no change fits, the headline names what bounds it", () => {
    const { scenario_data, fit } = planFixture().too_big;
    const view = { ...fit.view, changes: [], bound: "even with every lever each GPU needs 99 GiB", min_gpus: null,
      smallest_card: null };
    const { q, cleanup } = mount({ scenario_data, fit: { ...fit, view }, fit_open: true });
    assert.match(q(".memsim-fit-headline").textContent, /No change fits: even with every lever each GPU needs 99 GiB\./);
    assert.equal(q(".memsim-fit-table-change"), null);
    assert.match(q(".memsim-fit-facts").textContent, /no card in the catalog holds it as it is/);
    cleanup();
  });

  test("stale or rejected: labelled; a stale result cannot be applied", () => {
    const { scenario_data, fit } = planFixture().too_big;
    const { q, qa, model, cleanup } = mount({ scenario_data, fit: { ...fit, stale: true, state: "running" }, fit_open: true });
    assert.equal(q(".memsim-fit-stale-label").hidden, false);
    assert.match(q(".memsim-fit-stale-label").textContent, /previous scenario/);
    assert.ok(q(".memsim-fit-result").classList.contains("memsim-fit-stale"));
    assert.ok(qa(".memsim-fit-apply").every((b) => b.disabled));
    model.set("fit", { ...fit, rejected: true });
    assert.match(q(".memsim-fit-stale-label").textContent, /last valid scenario/);
    assert.ok(qa(".memsim-fit-apply").some((b) => !b.disabled), "a fix may replace a rejected input");
    cleanup();
  });

  test("a scenario that fits shows how far it goes and what each lever saves", () => {
    const { scenario_data, fit } = planFixture().roomy;
    const { window, q, qa, model, cleanup } = mount({ scenario_data, fit, fit_open: true });
    const v = fit.view;
    assert.match(q(".memsim-fit-headline").textContent, /^fits: .* to spare\. How far it goes:/);
    const facts = q(".memsim-fit-facts").textContent;
    assert.match(facts, new RegExp(`largest micro-batch that fits: ${v.max_micro_batch} \\(now ${v.micro_batch_size}\\)`));
    assert.match(facts, new RegExp(`longest sequence that fits: ${v.max_seq_len}`));
    assert.match(facts, /fewest GPUs that fit: 1 \(dp=1, ZeRO-0/);
    assert.equal(q(".memsim-fit-fact-min_gpus .memsim-fit-apply").disabled, true, "already on that many GPUs");
    assert.equal(qa(".memsim-fit-table-lever tbody tr").length, v.levers.length);
    assert.equal(q(".memsim-fit-table-change"), null);
    fire(window, q(".memsim-fit-fact-max_micro_batch .memsim-fit-apply"), "click");
    assert.deepEqual(model.sent.at(-1), { type: "fit_apply", kind: "max_micro_batch", index: 0, id: fit.id });
    fire(window, qa(".memsim-fit-table-lever .memsim-fit-apply")[2], "click");
    assert.deepEqual(model.sent.at(-1), { type: "fit_apply", kind: "lever", index: 2, id: fit.id });
    cleanup();
  });

  test("how far micro-batch and sequence go on the same GPUs with any layout, and Apply for each", () => {
    for (const name of ["roomy", "too_big"]) {
      const { scenario_data, fit } = planFixture()[name];
      const { window, q, model, cleanup } = mount({ scenario_data, fit, fit_open: true });
      const v = fit.view;
      for (const [kind, what, now] of [["max_micro_batch_searched", "largest micro-batch", v.micro_batch_size],
        ["max_seq_len_searched", "longest sequence", v.seq_len]]) {
        const r = v[kind];
        const li = q(`.memsim-fit-fact-${kind}`);
        assert.ok(r && li, `${name}: the fixture has a ${kind} answer, and the panel shows it`);
        assert.ok(li.textContent.startsWith(`${what} on this GPU with any layout: ${r.value} (now ${now}) as ${r.layout}; ` +
          `${r.device_total} per GPU`));
        assert.match(li.textContent, new RegExp(`the cheapest of ${r.reaching.toLocaleString("en-US")} that reach it \\(global batch free\\)`));
        fire(window, li.querySelector(".memsim-fit-apply"), "click");
        assert.deepEqual(model.sent.at(-1), { type: "fit_apply", kind, index: 0, id: fit.id });
      }
      model.set("fit", { ...fit, view: { ...v, max_micro_batch_searched: null, max_seq_len_searched: null } });
      assert.equal(q(".memsim-fit-fact-max_micro_batch_searched"), null, "none reached: no fact");
      cleanup();
    }
  });

  test("errors show in place and the rest keeps working", () => {
    const { scenario_data, fit } = planFixture().too_big;
    const { window, q, model, cleanup } = mount({ scenario_data, fit_open: true,
      fit: { ...fit, state: "error", error: "RuntimeError: planner broke", view: null } });
    assert.equal(q(".memsim-fit-error").hidden, false);
    assert.equal(q(".memsim-fit-error").textContent, "Make it fit: RuntimeError: planner broke");
    assert.equal(q(".memsim-fit-result").hidden, true);
    assert.equal(q(".memsim-error").hidden, true, "the widget's own error box is not involved");
    fire(window, q(".memsim-layouts-run"), "click");
    assert.deepEqual(model.sent.at(-1), { type: "layouts", gpus: null });
    model.set("fit", fit);
    assert.equal(q(".memsim-fit-error").hidden, true);
    assert.equal(q(".memsim-fit-result").hidden, false);
    cleanup();
  });

  test("fit and layouts also arrive as JSON text (how Python sends them)", () => {
    const { too_big: tb, layouts: lay } = planFixture();
    const { qa, cleanup } = mount({ scenario_data: tb.scenario_data, fit_open: true, fit: JSON.stringify(tb.fit),
      layouts: JSON.stringify(lay.layouts) });
    assert.equal(qa(".memsim-fit-table-change tbody tr").length, tb.fit.view.changes.length);
    assert.equal(qa(".memsim-layouts-table tbody tr").length, lay.layouts.view.top.length);
    cleanup();
  });
});

describe("layouts", () => {
  test("Search sends the GPU count (or none: the scenario's); running disables it", () => {
    const { window, q, model, cleanup } = mount({ fit_open: true });
    const run = q(".memsim-layouts-run");
    const gpus = q(".memsim-layouts-gpus");
    assert.equal(gpus.placeholder, String(model.get("scenario_data").num_gpus));
    assert.equal(gpus.getAttribute("data-lm-suppress-shortcuts"), "true");
    assert.equal(q(".memsim-layouts-result").hidden, true);
    fire(window, run, "click");
    assert.deepEqual(model.sent.at(-1), { type: "layouts", gpus: null });
    gpus.value = "16";
    fire(window, run, "click");
    assert.deepEqual(model.sent.at(-1), { type: "layouts", gpus: 16 });
    model.set("layouts", { ...model.get("layouts"), state: "running" });
    assert.equal(run.disabled, true);
    assert.equal(run.textContent, "Searching…");
    model.set("layouts", { ...model.get("layouts"), state: "error", error: "gpus: must be positive" });
    assert.equal(run.disabled, false);
    assert.equal(q(".memsim-layouts-error").textContent, "Layouts: gpus: must be positive");
    cleanup();
  });

  test("the best candidates with Apply, the one in use marked, the chart embedded", async () => {
    const embedded = [];
    deps.loadVegaEmbed = async () => async (el, spec) => {
      embedded.push({ cls: el.className, spec });
      return { view: {}, finalize() {} };
    };
    const { scenario_data, layouts } = planFixture().layouts;
    const { window, q, qa, model, cleanup } = mount({ scenario_data, layouts, fit_open: true, _vega_js: "bundle" });
    const v = layouts.view;
    assert.match(q(".memsim-layouts-summary").textContent,
      new RegExp(`^${v.evaluated.toLocaleString("en-US")} candidates for llama-3.1-8b on 2 × NVIDIA A100 40GB.*: ${v.fitting} fit \\(searched in 120 ms\\)`));
    const rows = qa(".memsim-layouts-table tbody tr");
    assert.equal(rows.length, v.top.length);
    assert.ok(rows.length <= 5);
    assert.match(rows[0].textContent, new RegExp(v.top[0].layout));
    // each candidate says which formats write its launch files, and why the others refuse (naming the field)
    const cell = rows[0].querySelector(".memsim-col-exports");
    const answers = Object.entries(v.top[0].exports);
    assert.equal(answers.length, 7);
    const ok = answers.filter(([, why]) => why === null).map(([fmt]) => fmt);
    assert.equal(cell.textContent, ok.length ? ok.join(", ") : "none");
    for (const [fmt, why] of answers.filter(([, w]) => w !== null)) {
      assert.ok(cell.getAttribute("title").includes(`${fmt}: ${why}`));
      assert.match(why, /^[a-z_.]+: cannot be exported to /);
    }
    const apply = rows[0].querySelector(".memsim-layout-apply");
    fire(window, apply, "click");
    assert.deepEqual(model.sent.at(-1), { type: "layout_apply", candidate: v.top[0].candidate, id: layouts.id });
    await until(() => embedded.some((e) => e.cls.includes("memsim-chart-candidates")));
    const chart = embedded.find((e) => e.cls.includes("memsim-chart-candidates"));
    assert.deepEqual(chart.spec, v.chart);

    // Python applied it: the scenario now uses the first layout, which is marked and cannot be applied again.
    const applied = planFixture().applied;
    model.set("scenario_data", applied.scenario_data);
    model.set("layouts", applied.layouts);
    const first = q(".memsim-layouts-table tbody tr");
    assert.ok(first.classList.contains("memsim-layout-current"));
    assert.equal(first.querySelector(".memsim-layout-apply").textContent, "current");
    assert.equal(first.querySelector(".memsim-layout-apply").disabled, true);

    model.set("layouts", { ...layouts, stale: true, stale_keys: ["seq_len"] });
    assert.match(q(".memsim-layouts-stale-label").textContent, /seq_len changed since/);
    assert.ok(qa(".memsim-layout-apply").every((b) => b.disabled), "a stale search cannot be applied");
    cleanup();
    assert.equal(model.listenerCount(), 0);
  });

  test("nothing fits: says so, no table", () => {
    const { scenario_data, layouts } = planFixture().layouts;
    const none = { ...layouts, view: { ...layouts.view, fitting: 0, top: [] } };
    const { q, cleanup } = mount({ scenario_data, layouts: none, fit_open: true });
    assert.match(q(".memsim-layouts-summary").textContent, /: 0 fit .*Nothing fits/);
    assert.equal(q(".memsim-layouts-table"), null);
    cleanup();
  });
});
