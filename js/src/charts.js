// Charts: vega-embed (imported from the `_vega_js` bundle Python sends) draws the Vega-Lite specs Python
// builds, one per frame after the DOM update is painted, skipping specs that did not change. Also the main
// charts' blocks with their PNG / SVG buttons.

import { download, h, mark } from "./dom.js";

const bundles = new Map();

async function importText(src) {
  if (typeof Blob !== "undefined" && typeof URL?.createObjectURL === "function") {
    const url = URL.createObjectURL(new Blob([src], { type: "text/javascript" }));
    try {
      return await import(/* webpackIgnore: true */ url);
    } catch {
      // runtimes without blob: module URLs (node): fall through to a data: URL
    } finally {
      URL.revokeObjectURL(url);
    }
  }
  return import(/* webpackIgnore: true */ "data:text/javascript;charset=utf-8," + encodeURIComponent(src));
}

/** Import an ES module given as source text (a blob: URL, else a data: URL); cached per source text. */
export function importFromSource(src) {
  if (!bundles.has(src)) bundles.set(src, importText(src));
  return bundles.get(src);
}

/** Dependencies tests can replace: how vega-embed is obtained from the `_vega_js` bundle. */
export const deps = {
  async loadVegaEmbed(src) {
    if (!src) return null;
    const mod = await importFromSource(src);
    return mod.vegaEmbed ?? mod.default ?? null;
  },
};

/** Resolve once the browser has painted (next frame, then a task); right away where no frames run (node).
 * Hidden tabs run no frames, so a timer resolves it too. */
export function afterPaint(win) {
  return new Promise((resolve) => {
    let done = false;
    const go = () => {
      if (!done) {
        done = true;
        setTimeout(resolve, 0);
      }
    };
    if (typeof win?.requestAnimationFrame === "function") {
      win.requestAnimationFrame(go);
      setTimeout(go, 50);
    } else {
      go();
    }
  });
}

/** The drawn views of a drawer: per chart name, its vega view, finalizer and the spec text it shows. */
function viewStore() {
  const views = {};
  const finalizers = {};
  const drawn = {};
  return {
    views,
    drawn,
    finalizers,
    drop(name) {
      finalizers[name]?.();
      delete finalizers[name];
      delete views[name];
      delete drawn[name];
    },
    keep(name, res, text) {
      finalizers[name]?.();
      views[name] = res.view;
      finalizers[name] = () => res.finalize?.();
      drawn[name] = text;
    },
  };
}

/** Draws named Vega-Lite specs into elements, one per frame, skipping unchanged ones. Returns `draw()`,
 * with `draw.views` (name -> vega view), `draw.forget()` (redraw all next time) and `draw.dispose()`. */
export function chartDrawer(doc, els, getSpecs, getBundle) {
  let token = 0;
  const store = viewStore();
  // Embed one chart unless it shows this spec already; false when a newer draw took over.
  const embedOne = async (embed, name, spec, mine) => {
    const text = JSON.stringify(spec);
    if (store.drawn[name] === text && store.views[name]) return true; // unchanged: keep the drawn view
    await afterPaint(doc.defaultView);
    if (mine !== token) return false;
    try {
      const res = await embed(els[name], structuredClone(spec), { actions: false, renderer: "svg" });
      if (mine !== token) {
        res.finalize?.();
        return false;
      }
      store.keep(name, res, text);
      mark(`drawn-${name}`);
    } catch (err) {
      els[name].textContent = `chart error: ${err.message}`;
      delete store.drawn[name];
    }
    return true;
  };
  const draw = async () => {
    const mine = ++token;
    const specs = getSpecs() ?? {};
    let embed;
    try {
      embed = await deps.loadVegaEmbed(getBundle());
      if (embed) mark("vega-loaded");
    } catch (err) {
      for (const name of Object.keys(els)) els[name].textContent = `charts unavailable: ${err.message}`;
      return;
    }
    if (mine !== token) return;
    for (const name of Object.keys(els)) {
      const spec = specs[name];
      if (!embed || !spec) {
        if (!spec) store.drop(name);
        else delete store.drawn[name];
        els[name].textContent = embed || !spec ? "" : "charts need vl-convert-python in the kernel";
        continue;
      }
      if (!(await embedOne(embed, name, spec, mine))) return;
    }
  };
  draw.views = store.views;
  draw.forget = () => {
    for (const name of Object.keys(store.drawn)) delete store.drawn[name];
  };
  draw.dispose = () => {
    token++;
    for (const name of Object.keys(store.finalizers)) store.finalizers[name]?.();
  };
  return draw;
}

/** A drawer of `els` from `getSpecs()`, redrawn on each trait in `traits` and when the bundle arrives;
 * disposed with the view. Returns `draw`. */
export function drawCharts(ctx, els, getSpecs, traits = []) {
  const draw = chartDrawer(ctx.doc, els, getSpecs, ctx.bundle);
  ctx.defer(() => draw.dispose());
  for (const name of traits) ctx.onModel(name, draw);
  ctx.onModel("_vega_js", () => {
    draw.forget();
    draw();
  });
  return draw;
}

/** The estimate's charts, each in a block with PNG and SVG buttons: `breakdown`, `scaling`, `time`, and
 * `phases` (the rollout and training phases of an RL objective; its block hides without that chart). */
export function createChartBlocks(doc, names = ["breakdown", "scaling", "time", "phases"]) {
  const els = {};
  const buttons = [];
  const blocks = {};
  for (const name of names) {
    els[name] = h(doc, "div", { class: `memsim-chart memsim-chart-${name}` });
    const tools = ["png", "svg"].map((fmt) => {
      const btn = h(doc, "button", { type: "button", class: `memsim-export memsim-${fmt}-${name}`,
        text: fmt.toUpperCase() });
      buttons.push({ btn, name, fmt });
      return btn;
    });
    blocks[name] = h(doc, "div", { class: `memsim-chart-block memsim-block-${name}` }, [
      els[name], h(doc, "div", { class: "memsim-tools" }, tools),
    ]);
  }
  return { els, blocks, buttons };
}

/** The "updating" line of the scaling chart's block, first in it (hidden). */
export function createScalingNote(doc, block) {
  const note = h(doc, "div", { class: "memsim-scaling-updating", role: "status", hidden: "",
    text: "updating for the new scenario… (the chart shown is the previous one)" });
  block.prepend(note);
  return note;
}

/** While Python computes the scaling view in the background (`result.scaling.pending`), the previous chart
 * stays, dimmed, under the "updating" line; the new chart replaces it when published. */
export function showScalingPending(block, note, result) {
  const pending = Boolean(result?.scaling?.pending);
  block.classList.toggle("memsim-updating", pending);
  note.hidden = !pending;
}

/** Hide the block of a chart that Python did not send (`phases` for SFT). */
export function showChartBlocks(blocks, specs, optional = ["phases"]) {
  for (const name of optional) if (blocks[name]) blocks[name].hidden = !specs?.[name];
}

/** The PNG / SVG buttons save the drawn chart (`draw.views`) as an image file. */
export function wireImageButtons(ctx, buttons, draw) {
  for (const { btn, name, fmt } of buttons) {
    ctx.listen(btn, "click", async () => {
      const view = draw.views[name];
      if (!view) return;
      const url = await view.toImageURL(fmt, fmt === "png" ? 2 : 1);
      download(ctx.doc, url, `memsim-${name}.${fmt}`);
    });
  }
}
