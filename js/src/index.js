// MemSim front end for anywidget. Python owns every derived value (the control list, choices, what is
// disabled, verdicts, charts, which layout is current); this module lays the view out and wires its parts:
//   controls.js      the controls, drawn from `options`, writing `scenario_data` / `headroom`
//   verdict.js       the verdict panel, the breakdown table and its CSV (`result`)
//   charts.js        vega-embed from `_vega_js`: the estimate's charts (`charts`, `phases` for an RL objective)
//                    with PNG / SVG export
//   fit.js           "Make it fit" (`fit_open`, `fit`, {type: "fit_apply"}); layouts.js its "Layouts"
//   compare.js       "Pin" and the comparison (`pins`, `comparison`)
//   trace.js         "Verify with trace" (`trace`, `trace_view`, {type: "verify" | "cancel"})
//   export.js        the launch-config export (`export`, {type: "export", format})
//   import.js        "open a config" (`config_import`, {type: "import_config", files}) and the Verify panel's
//                    "Measure on this GPU" (`measure`, {type: "measure"})
//   calibration.js   "calibrating..." while a calibrated model's first estimate runs in the background
//                    (`calibration`)
//   scenario-json.js the scenario as JSON; state.js, dom.js, format.js: shared helpers
// The shipped file is js/widget.js, bundled from these sources by esbuild (`scripts/dev build-js`).

import { createCalibrationLine, isCalibrating, showCalibration } from "./calibration.js";
import {
  createChartBlocks, createScalingNote, drawCharts, showChartBlocks, showScalingPending, wireImageButtons,
} from "./charts.js";
import { createComparePanel, wireCompare } from "./compare.js";
import { controlsPanel } from "./controls.js";
import { h, mark } from "./dom.js";
import { createExportPanel, wireExport } from "./export.js";
import { createFitPanel, wireFit } from "./fit.js";
import { createImportPanel, createMeasurePanel, wireImport, wireMeasure } from "./import.js";
import { createJsonEditor, wireJsonEditor } from "./scenario-json.js";
import { readTrait, viewContext } from "./state.js";
import { createTracePanel, wireTrace } from "./trace.js";
import { createResultViews, renderResult } from "./verdict.js";

/** The output column: error, verdict, panels, charts, trace, table, JSON and export, in the order shown. */
function createOutput(doc) {
  const parts = {
    error: h(doc, "div", { class: "memsim-error", role: "alert", hidden: "" }),
    calibrating: createCalibrationLine(doc),
    result: createResultViews(doc),
    charts: createChartBlocks(doc),
    trace: createTracePanel(doc),
    fit: createFitPanel(doc),
    compare: createComparePanel(doc),
    json: createJsonEditor(doc),
    export: createExportPanel(doc),
    import: createImportPanel(doc),
    measure: createMeasurePanel(doc),
  };
  parts.trace.root.append(parts.measure.root); // the Verify panel offers the GPU measurement
  parts.scalingNote = createScalingNote(doc, parts.charts.blocks.scaling);
  parts.root = h(doc, "div", { class: "memsim-output" }, [
    parts.error, parts.calibrating, parts.result.verdict, parts.fit.root, parts.compare.root, ...Object.values(parts.charts.blocks),
    parts.trace.root, parts.result.details, parts.json.root, parts.export.root, parts.import.root,
  ]);
  return parts;
}

/** anywidget entry point: draw the widget into `el`; returns the cleanup function. */
export function render({ model, el }) {
  mark("render");
  const ctx = viewContext(el.ownerDocument, model);
  const { doc, onModel } = ctx;
  const controls = controlsPanel(ctx);
  const out = createOutput(doc);
  el.replaceChildren(h(doc, "div", { class: "memsim" }, [controls.root, out.root]));

  const fail = (message) => {
    out.error.textContent = message;
    out.error.hidden = false;
  };
  const syncJson = wireJsonEditor(ctx, out.json, fail);
  const syncAll = () => {
    controls.sync();
    syncJson();
  };
  // the last result is greyed while an input is rejected or being calibrated
  const markStale = () => out.root.classList.toggle("memsim-stale", Boolean(model.get("error")) || isCalibrating(model));
  const showError = () => {
    const msg = model.get("error") ?? "";
    out.error.textContent = msg ? `${msg}. Showing the last valid result.` : "";
    out.error.hidden = !msg;
    markStale();
    syncAll();
  };
  const onCalibration = () => {
    showCalibration(out.calibrating, model);
    markStale();
  };
  const showResult = () => {
    const result = readTrait(model, "result") ?? {};
    renderResult(doc, out.result, result);
    showScalingPending(out.charts.blocks.scaling, out.scalingNote, result);
  };
  // Charts draw after the verdict and table are painted, one per frame: embedding a chart takes tens of
  // milliseconds (the scaling view over a hundred), and the new result should not wait for it on screen.
  wireCompare(ctx, out.compare);
  onModel("scenario_data", syncAll);
  const fit = wireFit(ctx, out.fit);
  const trace = wireTrace(ctx, out.trace);
  const showBlocks = () => showChartBlocks(out.charts.blocks, readTrait(model, "charts"));
  onModel("charts", showBlocks);
  const charts = drawCharts(ctx, out.charts.els, () => readTrait(model, "charts"), ["charts"]);
  wireImageButtons(ctx, out.charts.buttons, charts);
  onModel("headroom", syncAll);
  onModel("error", showError);
  onModel("calibration", onCalibration);
  onModel("error_field", syncAll);
  onModel("result", showResult);
  onModel("options", () => {
    controls.update();
    syncAll();
  });

  wireExport(ctx, out.export)();
  wireImport(ctx, out.import)();
  wireMeasure(ctx, out.measure)();
  showError();
  onCalibration();
  showResult();
  trace.show();
  fit.show();
  fit.layouts.show();
  showBlocks();
  charts();
  trace.draw();
  fit.layouts.draw();
  return () => {
    ctx.dispose();
    el.replaceChildren();
  };
}

export default { render };
