// The scaling chart and summary while Python computes a new scenario's scaling view in the background
// (memsim_widget/widget/scaling_panel.py): `result.scaling` is {pending: true} until the view is published.
import assert from "node:assert/strict";
import { afterEach, beforeEach, test } from "node:test";

import { deps } from "../../js/src/charts.js";
import { render } from "../../js/src/index.js";
import { SCALING_PENDING_TEXT, scalingText } from "../../js/src/verdict.js";
import { fakeModel, fixtureState, makeDom } from "./fake-model.mjs";

const realLoad = deps.loadVegaEmbed;

beforeEach(() => {
  deps.loadVegaEmbed = async () => null;
});

afterEach(() => {
  deps.loadVegaEmbed = realLoad;
});

function mount() {
  const { el } = makeDom();
  const model = fakeModel(fixtureState());
  const cleanup = render({ model, el });
  return { model, cleanup, q: (sel) => el.querySelector(sel) };
}

test("the summary names the largest micro-batch and sequence, or says updating without a number", () => {
  const done = {
    micro_batch_size: { max_fit: 8, exceeds_at: 16, invalid: [] },
    seq_len: { max_fit: 4096, exceeds_at: 8192, invalid: [] },
  };
  assert.equal(scalingText(done),
    "largest micro-batch that fits: 8 (exceeds the GPU at ≈16); longest sequence that fits: 4096");
  assert.equal(scalingText({ pending: true }), SCALING_PENDING_TEXT);
  assert.doesNotMatch(scalingText({ pending: true }), /\d/);
  assert.equal(scalingText({ error: "ValueError: boom" }), "how it scales: ValueError: boom");
});

test("while pending the previous chart is marked updating and the summary has no number; published, both clear", () => {
  const { model, q, cleanup } = mount();
  const block = q(".memsim-block-scaling");
  const note = q(".memsim-scaling-updating");
  assert.equal(note.parentElement, block);
  assert.equal(note.hidden, true);
  assert.ok(!block.classList.contains("memsim-updating"));
  const published = model.get("result");
  assert.match(q(".memsim-scaling-summary").textContent, /^largest micro-batch that fits: none/);

  model.set("result", { ...published, scaling: { pending: true } });
  assert.equal(note.hidden, false);
  assert.ok(block.classList.contains("memsim-updating"));
  assert.ok(q(".memsim-chart-scaling"), "the previous chart's element stays");
  const summary = q(".memsim-scaling-summary");
  assert.equal(summary.textContent, SCALING_PENDING_TEXT);
  assert.ok(summary.classList.contains("memsim-scaling-pending"));

  model.set("result", { ...published, scaling: { ...published.scaling, micro_batch_size: { max_fit: 2, exceeds_at: 4, invalid: [] } } });
  assert.equal(note.hidden, true);
  assert.ok(!block.classList.contains("memsim-updating"));
  assert.match(q(".memsim-scaling-summary").textContent, /^largest micro-batch that fits: 2 \(exceeds the GPU at ≈4\)/);
  cleanup();
});
