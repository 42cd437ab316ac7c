// Numbers and rows in words: sizes as Python's `fmt_bytes` writes them, percentages, counts, the CSV export.

const CSV_COLUMNS = ["rank", "stage", "moment", "category", "item", "bytes", "gib", "counter", "formula"];

/** Human-readable binary size, like Python's `fmt_bytes` (`14.96 GiB`). */
export function fmtBytes(n) {
  const units = [["GiB", 1024 ** 3], ["MiB", 1024 ** 2], ["KiB", 1024]];
  for (const [unit, size] of units) {
    if (Math.abs(n) >= size) return `${(n / size).toFixed(2)} ${unit}`;
  }
  return `${Math.trunc(n)} B`;
}

/** GiB with two decimals (`12.34 GiB`): how "Make it fit" states the memory a change saves. */
export function fmtGiB(gib) {
  return `${Number(gib ?? 0).toFixed(2)} GiB`;
}

/** A signed percentage with two decimals (`+1.25%`); `n/a` when there is none. */
export function fmtPct(x) {
  if (x === null || x === undefined || Number.isNaN(x)) return "n/a";
  return `${x > 0 ? "+" : ""}${Number(x).toFixed(2)}%`;
}

/** A count with thousands separators (`12,345`). */
export function fmtCount(n) {
  return Number(n ?? 0).toLocaleString("en-US");
}

/** The breakdown rows as CSV (header + one line per row, RFC 4180 quoting). */
export function rowsToCsv(rows, columns = CSV_COLUMNS) {
  const cell = (v) => {
    const s = v === null || v === undefined ? "" : String(v);
    return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  };
  return [columns.join(","), ...rows.map((r) => columns.map((c) => cell(r[c])).join(","))].join("\n") + "\n";
}
