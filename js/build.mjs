// Bundle the front end: js/src/index.js and the modules it imports -> js/widget.js, the one ES module the
// widget loads (`_esm`) and the wheel ships (pyproject maps it to memsim_widget/static/widget.js).
//   node js/build.mjs          write js/widget.js   (scripts/dev build-js)
//   node js/build.mjs --check  exit 1 when js/widget.js differs from a fresh build (scripts/dev test, CI)
// The output is deterministic: no minification, no timestamps, paths relative to the repository.
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

import * as esbuild from "esbuild";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
export const BUNDLE = fileURLToPath(new URL("./widget.js", import.meta.url));

const BANNER = "// memsim-widget front end, bundled by esbuild from js/src/ (node js/build.mjs): edit the sources, not\n" +
  "// this file. A node test (tests/js/bundle.test.mjs) fails when it differs from a fresh build.";

/** esbuild's options for the bundle (one ES module, readable, no source map). */
export const OPTIONS = {
  absWorkingDir: ROOT,
  entryPoints: ["js/src/index.js"],
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  charset: "utf8",
  legalComments: "none",
  banner: { js: BANNER },
  write: false,
  logLevel: "warning",
};

/** The bundle's text, freshly built from the sources. */
export async function buildBundle() {
  const result = await esbuild.build(OPTIONS);
  return result.outputFiles[0].text;
}

async function main() {
  const text = await buildBundle();
  if (process.argv.includes("--check")) {
    if (readFileSync(BUNDLE, "utf8") !== text) {
      console.error("js/widget.js is not the bundle of js/src/: run `scripts/dev build-js` and commit it");
      process.exit(1);
    }
    return;
  }
  writeFileSync(BUNDLE, text);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) await main();
