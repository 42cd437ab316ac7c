// The widget drawing the real chart specs with the real vega-embed bundle (the one Python sends as `_vega_js`),
// in jsdom. The bundle is the file memsim_widget.widget.vega_bundle() caches ($MEMSIM_VEGA_BUNDLE, else
// $MEMSIM_CACHE_DIR or ~/.cache/memsim-widget/vega-embed-*.js); without it the test is skipped.
import assert from "node:assert/strict";
import { existsSync, readFileSync, readdirSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";

import { fakeModel, fixtureState, makeDom, traceFixture } from "./fake-model.mjs";

function findBundle() {
  if (process.env.MEMSIM_VEGA_BUNDLE) return process.env.MEMSIM_VEGA_BUNDLE;
  const base = process.env.XDG_CACHE_HOME ?? path.join(os.homedir(), ".cache");
  const dir = process.env.MEMSIM_CACHE_DIR ?? path.join(base, "memsim-widget");
  if (!existsSync(dir)) return null;
  const file = readdirSync(dir).filter((f) => /^vega-embed-.*\.js$/.test(f)).sort().pop();
  return file ? path.join(dir, file) : null;
}

const bundlePath = findBundle();

test("render draws the estimate's and the trace's charts with the real vega-embed bundle", { skip: !bundlePath && "no vega bundle cached" }, async () => {
  const { window, el } = makeDom();
  // vega-embed reads browser globals; node --test runs each file in its own process.
  for (const key of ["window", "document", "navigator", "ShadowRoot", "HTMLElement", "SVGElement", "Element",
    "Node", "getComputedStyle", "requestAnimationFrame", "Event", "MouseEvent"]) {
    try {
      globalThis[key] ??= key === "window" ? window : window[key];
    } catch {
      // read-only globals (navigator on newer node) are fine as they are
    }
  }
  window.HTMLCanvasElement.prototype.getContext = () => null; // vega then estimates text widths
  const { render } = await import("../../js/src/index.js");
  const charts = JSON.parse(readFileSync(new URL("./fixtures/charts.json", import.meta.url), "utf8"));
  const { trace, trace_view: view } = traceFixture();
  const model = fakeModel({
    ...fixtureState(),
    charts: JSON.stringify(charts),
    trace,
    trace_view: JSON.stringify(view),
    _vega_js: readFileSync(bundlePath, "utf8"),
  });
  const cleanup = render({ model, el });
  const drawn = async (sel) => {
    for (let i = 0; i < 200; i++) {
      const svg = el.querySelector(`${sel} svg`);
      if (svg) return svg;
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error(`${sel}: no svg; text: ${el.querySelector(sel)?.textContent}`);
  };
  const bars = await drawn(".memsim-chart-breakdown");
  const labels = [...bars.querySelectorAll("text")].map((t) => t.textContent);
  assert.ok(labels.includes("stage 0") && labels.includes("stage 1"), "one bar per pipeline stage");
  assert.ok(labels.some((t) => t.includes("GiB")), "capacity and total labels");
  assert.ok(labels.includes("optimizer_states"), "category legend");
  const scaling = await drawn(".memsim-chart-scaling");
  const stext = [...scaling.querySelectorAll("text")].map((t) => t.textContent);
  assert.ok(stext.includes("memory vs micro-batch size") && stext.includes("memory vs sequence length"));
  const stepTime = await drawn(".memsim-chart-time");
  const steptext = [...stepTime.querySelectorAll("text")].map((t) => t.textContent);
  assert.ok(steptext.includes("seconds per step"), "the step-time chart beside the memory breakdown");
  const timeline = await drawn(".memsim-chart-trace-timeline");
  const ttext = [...timeline.querySelectorAll("text")].map((t) => t.textContent);
  assert.ok(ttext.some((t) => t.startsWith("Live tensor memory through two training steps")), "timeline title");
  assert.ok(ttext.some((t) => /^peak \d+\.\d{3} GiB \(backward, step 2\)$/.test(t)), "the peak is labelled");
  assert.ok(timeline.querySelector(".mark-area path"), "live bytes as an area");
  assert.ok(timeline.querySelector(".mark-rule line"), "the peak as a rule");
  const comparison = await drawn(".memsim-chart-trace-comparison");
  const ctext = [...comparison.querySelectorAll("text")].map((t) => t.textContent);
  assert.ok(ctext.includes("traced") && ctext.includes("simulated") && ctext.includes("activations"));
  assert.equal(comparison.querySelectorAll(".mark-rect path").length, 6, "3 categories x traced/simulated");
  cleanup();
  assert.equal(model.listenerCount(), 0);
});
