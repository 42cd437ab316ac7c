// A minimal stand-in for anywidget's model: get/set with change:<key> events, on/off, save_changes, and send
// (custom messages to Python, recorded in `sent`).
import { readFileSync } from "node:fs";
import { JSDOM } from "jsdom";

export function fakeModel(initial) {
  const state = structuredClone(initial);
  const handlers = new Map();
  const model = {
    saves: 0,
    get: (key) => state[key],
    set(key, value) {
      state[key] = value;
      for (const fn of [...(handlers.get(`change:${key}`) ?? [])]) fn({}, value);
    },
    on(event, fn) {
      if (!handlers.has(event)) handlers.set(event, new Set());
      handlers.get(event).add(fn);
    },
    off(event, fn) {
      handlers.get(event)?.delete(fn);
    },
    save_changes() {
      model.saves += 1;
    },
    sent: [],
    send(content) {
      model.sent.push(content);
    },
    listenerCount: () => [...handlers.values()].reduce((n, set) => n + set.size, 0),
  };
  return model;
}

/** The widget's traits as Python sends them (tests/js/fixtures/state.json, written by tests/widget/test_widget.py). */
export function fixtureState() {
  return JSON.parse(readFileSync(new URL("./fixtures/state.json", import.meta.url), "utf8"));
}

/** A finished trace as Python sends it: `trace` and `trace_view` (tests/js/fixtures/trace.json). */
export function traceFixture() {
  return JSON.parse(readFileSync(new URL("./fixtures/trace.json", import.meta.url), "utf8"));
}

/** A fresh jsdom document with an element to render into. */
export function makeDom() {
  const dom = new JSDOM("<!doctype html><html><body><div id=host></div></body></html>");
  const doc = dom.window.document;
  return { dom, doc, el: doc.getElementById("host"), window: dom.window };
}

/** Fire a DOM event of `type` on `el`. */
export function fire(window, el, type) {
  el.dispatchEvent(new window.Event(type, { bubbles: true }));
}

/** "Make it fit" as Python sends it (tests/js/fixtures/plan.json, written by tests/widget/test_widget_plan.py):
 * `too_big` and `roomy` ({scenario_data, fit}) and `layouts` ({scenario_data, layouts}). */
export function planFixture() {
  return JSON.parse(readFileSync(new URL("./fixtures/plan.json", import.meta.url), "utf8"));
}
