import assert from "node:assert/strict";
import { test } from "node:test";

import { calibrationText } from "../../js/src/calibration.js";
import { render } from "../../js/src/index.js";
import { fakeModel, fixtureState, makeDom } from "./fake-model.mjs";

const RUNNING = { state: "running", model: "opt (inline config)", error: "", seconds: 0 };

function mount(calibration) {
  const { el } = makeDom();
  const model = fakeModel({ ...fixtureState(), ...(calibration ? { calibration } : {}) });
  const cleanup = render({ model, el });
  return { model, cleanup, q: (sel) => el.querySelector(sel) };
}

test("no calibration trait (an older Python) or an idle one: no calibrating line", () => {
  for (const calibration of [undefined, { ...RUNNING, state: "idle" }]) {
    const { q, cleanup } = mount(calibration);
    assert.equal(q(".memsim-calibrating").hidden, true);
    assert.ok(!q(".memsim-output").classList.contains("memsim-stale"));
    cleanup();
  }
});

test("while a calibration runs the line names the model over the greyed last result; done hides it", () => {
  const { model, q, cleanup } = mount({ ...RUNNING, state: "idle" });
  model.set("calibration", RUNNING);
  const line = q(".memsim-calibrating");
  assert.equal(line.hidden, false);
  assert.equal(line.textContent, calibrationText(RUNNING));
  assert.match(line.textContent, /^Calibrating opt \(inline config\) from traces/);
  assert.ok(q(".memsim-output").classList.contains("memsim-stale"));
  assert.ok(q(".memsim-verdict"));  // the last result is still drawn
  model.set("calibration", { ...RUNNING, state: "done", seconds: 31.2 });
  assert.equal(line.hidden, true);
  assert.ok(!q(".memsim-output").classList.contains("memsim-stale"));
  cleanup();
});
