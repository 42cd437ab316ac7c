// The model side: traits Python sends as JSON text (parsed once per value), dotted scenario keys, and the
// listeners a view adds (to the model and to its elements), removed together by its cleanup.

const parsed = new WeakMap();

/** A trait that Python may send as JSON text (options, result, charts): parsed once per new value. */
export function readTrait(model, key) {
  const value = model.get(key);
  if (typeof value !== "string") return value;
  let cache = parsed.get(model);
  if (!cache) parsed.set(model, (cache = new Map()));
  const hit = cache.get(key);
  if (hit && hit.text === value) return hit.value;
  const out = value ? JSON.parse(value) : {};
  cache.set(key, { text: value, value: out });
  return out;
}

/** Value at a dotted key (`parallel.tp`, `model.hidden_size`); undefined when absent. */
export function getPath(obj, key) {
  let cur = obj;
  for (const part of key.split(".")) {
    if (cur === null || typeof cur !== "object") return undefined;
    cur = cur[part];
  }
  return cur;
}

/** A deep copy of `obj` with the dotted `key` set to `value` (objects are created on the way). */
export function setPath(obj, key, value) {
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

/**
 * What each panel's `wire*` function gets: the document and model, and listeners undone together.
 * @typedef {object} ViewContext
 * @property {Document} doc
 * @property {object} model anywidget's model (`get`, `set`, `on`, `off`, `save_changes`, `send`)
 * @property {(fn: () => void) => void} defer run `fn` at `dispose()`
 * @property {(target: EventTarget, type: string, fn: Function) => void} listen a DOM listener
 * @property {(name: string, fn: Function) => void} onModel a `change:<name>` listener
 * @property {() => string} bundle the vega-embed source (`_vega_js`)
 * @property {(name: string, value: any) => void} save write a trait and send it to Python
 * @property {() => void} dispose remove every listener, run every deferred function
 */

/** A view's context (see `ViewContext`) for `model`, rendered into `doc`.
 * @returns {ViewContext} */
export function viewContext(doc, model) {
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
    },
  };
}
