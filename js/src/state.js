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

/** A view's context: `doc`, `model`, `listen(target, type, fn)` and `onModel(trait, fn)` (both undone by
 * `dispose()`), `defer(fn)` (run at dispose) and `bundle()` (the vega-embed source, `_vega_js`). */
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
