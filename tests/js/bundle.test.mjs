// The shipped bundle (js/widget.js, what the widget loads and the wheel ships) is the esbuild build of
// js/src/: a hand edit of the bundle, or a source change without `scripts/dev build-js`, fails here (and CI).
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { test } from "node:test";

import { BUNDLE, buildBundle } from "../../js/build.mjs";
import { fakeModel, fixtureState, makeDom } from "./fake-model.mjs";

test("js/widget.js is the esbuild bundle of js/src/ (run scripts/dev build-js after editing the sources)", async () => {
  const fresh = await buildBundle();
  assert.ok(readFileSync(BUNDLE, "utf8") === fresh, "js/widget.js is stale or edited by hand: run scripts/dev build-js");
  assert.equal(await buildBundle(), fresh, "the build is deterministic");
});

test("the bundle exports render (and a default with it) and renders the widget", async () => {
  const mod = await import("../../js/widget.js");
  assert.equal(typeof mod.render, "function");
  assert.equal(mod.default.render, mod.render);
  const { el } = makeDom();
  const model = fakeModel({ ...fixtureState(), charts: {} });
  const cleanup = mod.render({ model, el });
  const { controls } = fixtureState().options;
  assert.equal(el.querySelectorAll(".memsim-controls .memsim-field").length, controls.length);
  assert.ok(el.querySelector(".memsim-verdict-word"));
  cleanup();
  assert.equal(model.listenerCount(), 0);
});

test("each source module stays under 400 lines (one concern per module)", () => {
  const dir = new URL("../../js/src/", import.meta.url);
  const sizes = readdirSync(dir).filter((f) => f.endsWith(".js"))
    .map((f) => [f, readFileSync(new URL(f, dir), "utf8").split("\n").length - 1]);
  assert.ok(sizes.length >= 10);
  assert.deepEqual(sizes.filter(([, n]) => n >= 400), []);
});
