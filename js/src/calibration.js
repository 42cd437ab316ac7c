// "Calibrating ..." while a calibrated model's first estimate runs in the background (`calibration` trait):
// Python computes it off the update (memsim_widget/widget/calibration_panel.py); the last result stays, greyed.

import { h } from "./dom.js";
import { readTrait } from "./state.js";

/** What the line says while a calibrated model's first estimate runs (`calibration` trait). */
export function calibrationText(calibration) {
  return `Calibrating ${calibration.model || "the model"} from traces (about a dozen tiny traces, ~30 s the first `
    + "time): showing the last result until its estimate is ready.";
}

/** The (hidden) status line. */
export function createCalibrationLine(doc) {
  return h(doc, "div", { class: "memsim-calibrating", role: "status", hidden: "" });
}

/** Whether a calibration runs now (an older Python without the trait: never). */
export function isCalibrating(model) {
  return (readTrait(model, "calibration") ?? {}).state === "running";
}

/** Show or hide the line for the current `calibration` trait. */
export function showCalibration(line, model) {
  const running = isCalibrating(model);
  line.textContent = running ? calibrationText(readTrait(model, "calibration")) : "";
  line.hidden = !running;
}
