// The compare panel in jsdom: "Pin" and remove write `pins`; the panel draws `comparison` as Python sends it
// (tests/js/fixtures/compare.json, written by tests/widget/test_widget_compare.py): pins, table, highlighted differences.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { afterEach, beforeEach, describe, test } from "node:test";

import { deps } from "../../js/src/charts.js";
import { withPin, withoutPin } from "../../js/src/compare.js";
import { render } from "../../js/src/index.js";
import { fakeModel, fire, fixtureState, makeDom } from "./fake-model.mjs";

const realLoad = deps.loadVegaEmbed;
const compareFixture = () => JSON.parse(readFileSync(new URL("./fixtures/compare.json", import.meta.url), "utf8"));

function mount(overrides = {}) {
  const { el, window } = makeDom();
  const model = fakeModel({ ...fixtureState(), ...overrides });
  const cleanup = render({ model, el });
  const q = (sel) => el.querySelector(sel);
  const qa = (sel) => [...el.querySelectorAll(sel)];
  return { window, model, cleanup, q, qa };
}

beforeEach(() => {
  deps.loadVegaEmbed = async () => null;
});

afterEach(() => {
  deps.loadVegaEmbed = realLoad;
});

describe("compare", () => {
  test("pure helpers: Pin appends a copy of the scenario unnamed, remove drops one entry", () => {
    const scenario = { model: "llama-3.2-1b", parallel: { tp: 1 } };
    const pins = withPin([{ name: "pin 1", scenario: {} }], scenario);
    assert.deepEqual(pins, [{ name: "pin 1", scenario: {} }, { name: "", scenario }]);
    assert.notEqual(pins[1].scenario, scenario, "a copy: later edits of scenario_data do not move the pin");
    assert.deepEqual(withPin(undefined, scenario), [{ name: "", scenario }]);
    assert.deepEqual(withoutPin([{ name: "a" }, { name: "b" }, { name: "c" }], 1), [{ name: "a" }, { name: "c" }]);
    assert.deepEqual(withoutPin(undefined, 0), []);
  });

  test("without pins: a Pin button and a hint; clicking it writes pins, and Python computes the rest", () => {
    const { window, q, model, cleanup } = mount();
    assert.equal(q(".memsim-compare-body").hidden, true);
    assert.equal(q(".memsim-pin").disabled, false);
    assert.equal(q(".memsim-pin").getAttribute("data-lm-suppress-shortcuts"), "true");
    assert.match(q(".memsim-compare-status").textContent, /^Pin this scenario, then change a knob/);
    fire(window, q(".memsim-pin"), "click");
    assert.deepEqual(model.get("pins"), [{ name: "", scenario: model.get("scenario_data") }]);
    assert.equal(model.saves, 1);
    assert.deepEqual(model.sent, [], "pinning is a trait write, not a message");
    cleanup();
  });

  test("with pins: the list, the table with the differing field highlighted against the current scenario", () => {
    const { scenario_data, pins, comparison } = compareFixture();
    const { window, q, qa, model, cleanup } = mount({ scenario_data, pins, comparison: JSON.stringify(comparison) });
    const items = qa(".memsim-pin-item");
    assert.deepEqual(items.map((li) => li.querySelector("b").textContent), ["pin 1", "pin 2"]);
    assert.ok(items[0].textContent.includes(comparison.pins[0].summary));
    assert.equal(q(".memsim-compare-body").hidden, false);
    const heads = qa(".memsim-compare-table thead th").map((th) => th.textContent);
    assert.deepEqual(heads, ["", "pin 1", "pin 2", "current"]);
    const diff = qa(".memsim-compare-diff");
    assert.deepEqual(diff.map((tr) => tr.querySelector("th").textContent), comparison.view.differences.map((d) => d.field));
    const method = diff.find((tr) => tr.querySelector("th").textContent === "method");
    assert.deepEqual([...method.querySelectorAll("td")].map((td) => td.textContent), ["full", "lora", "qlora"]);
    assert.deepEqual([...method.querySelectorAll("td")].map((td) => td.classList.contains("memsim-compare-changed")),
      [true, true, false], "pins that differ from the current scenario are highlighted, the current one is not");
    const peaks = [...q(".memsim-compare-peak").querySelectorAll("td")].map((td) => td.textContent);
    assert.deepEqual(peaks, comparison.view.rows.map((r) => r.peak));
    const verdicts = [...q(".memsim-compare-verdict").querySelectorAll("td")];
    assert.deepEqual(verdicts.map((td) => [td.textContent, td.className]),
      comparison.view.rows.map((r) => [r.verdict, `memsim-compare-${r.verdict.replace(/ /g, "-")}`]));
    assert.match(q(".memsim-compare-status").textContent, /^2 of 3 pinned/);
    fire(window, items[0].querySelector(".memsim-unpin"), "click");
    assert.deepEqual(model.get("pins"), [pins[1]], "remove writes the pins without that entry");
    cleanup();
  });

  test("Pin is off at the limit and while the input is rejected; a refused pin's reason is shown", () => {
    const { scenario_data, pins, comparison } = compareFixture();
    const full = { ...comparison, pins: [...comparison.pins, { name: "pin 3", summary: "x" }],
      error: "pins: this scenario is pinned already (pin 1)" };
    const { window, q, model, cleanup } = mount({ scenario_data, pins, comparison: JSON.stringify(full) });
    assert.equal(q(".memsim-pin").disabled, true);
    assert.equal(q(".memsim-compare-status").textContent, "3 pinned: remove one to pin another");
    assert.equal(q(".memsim-compare-error").hidden, false);
    assert.equal(q(".memsim-compare-error").textContent, "Pin refused: pins: this scenario is pinned already (pin 1)");
    fire(window, q(".memsim-pin"), "click");
    assert.equal(model.saves, 0);
    model.set("comparison", JSON.stringify(comparison));
    assert.equal(q(".memsim-pin").disabled, false);
    model.set("error", "micro_batch_size: must be an integer >= 1");
    assert.equal(q(".memsim-pin").disabled, true);
    assert.match(q(".memsim-compare-status").textContent, /rejected/);
    model.set("comparison", JSON.stringify({ ...comparison, pins: [], view: null }));
    assert.equal(q(".memsim-compare-body").hidden, true);
    assert.equal(q(".memsim-pins").children.length, 0);
    cleanup();
  });
});
