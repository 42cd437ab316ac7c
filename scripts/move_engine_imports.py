#!/usr/bin/env python3
"""Rewrite every reference to an engine module's old path to its new one (issue #28: ``engine/`` in sub-packages).

Usage (from the repository root; idempotent: a second run changes nothing)::

    python scripts/move_engine_imports.py            # rewrite, print each change, then ruff-fix import order
    python scripts/move_engine_imports.py --check    # print what would change; exit 1 if anything would
    python scripts/move_engine_imports.py --no-ruff  # rewrite without running ruff afterwards
    python scripts/move_engine_imports.py PATH ...   # only these files or folders

What it rewrites, in every tracked or untracked (not ignored) text file of the repository:

- dotted and slashed paths: ``memsim_widget.engine.timeline`` -> ``memsim_widget.engine.step.timeline``,
  ``engine/overhead.py`` -> ``engine/counters/overhead.py``, ``engine/step_time.fn`` ->
  ``engine/speed/step_time.fn`` (imports, ``import a.b.c``, strings given to ``mock.patch`` or
  ``monkeypatch.setattr``, importlib names, docstrings, comments, docs, notebooks' sources and outputs); a path is
  matched only as ``memsim_widget.engine.X`` / ``memsim_widget/engine/X`` or as ``engine.X`` / ``engine/X`` with
  nothing path-like before ``engine`` (``vllm/engine/X`` is left alone), and in Python code (outside strings and
  comments) only with the package (``engine.moments`` there is a variable's attribute);
- ``from memsim_widget.engine import a, b as c`` (Python files, any layout): each moved module imported from its
  new package, under its old name when its file was renamed (``from memsim_widget.engine.multimodal import tower
  as vision``); in Markdown and notebooks, one-line forms whose moved names share one package;
- relative imports (``from .timeline import x``, ``from ..overhead import y``, ``from . import moments``) that
  name a moved module, or that no longer resolve because the importing file itself moved: made absolute (the
  package's style) with the new path.

Merging the move after branches that edited the old files: git's rename detection carries their edits to the new
paths; where a hunk conflicts, the move's side only rewrote paths, so ``git merge -X ours enginepkg`` (their side
of each conflicting hunk) followed by this script gives the merged code with every path new (check by hand the four
files the move edited beyond paths: docs/architecture.md's engine tree, engine/__init__.py,
engine/activations/__init__.py, tests/engine/test_engine_layout.py).

No new package name is an old module's name, so a rewritten path never matches again. Ruff (``ruff check
--select I --fix`` and ``ruff format``) then re-sorts and re-wraps the Python files it changed.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import json
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = "memsim_widget.engine"

#: old module (under ``memsim_widget.engine``) -> its new dotted path under ``memsim_widget.engine``.
MOVES: dict[str, str] = {
    # the three GPU counters beyond live tensors: the caching allocator replayed, its stream, the overheads
    "allocator": "counters.allocator",
    "alloc_stream": "counters.alloc_stream",
    "overhead": "counters.overhead",
    # activation rules of whole model kinds beside the per-block ones
    "calibrated": "activations.calibrated",
    "hybrid": "activations.hybrid",
    # the vision side of multimodal models, one module per kind
    "vision": "multimodal.tower",
    "vision_qwen": "multimodal.qwen_vl",
    "vision_llava_next": "multimodal.llava_next",
    "llama4_vision": "multimodal.llama4",
    # the step time
    "step_time": "speed.step_time",
    "time_breakdown": "speed.time_breakdown",
    "gpu_speed": "speed.gpu_speed",
    "flops": "speed.flops",
    # pipeline stages and the layout's ranks
    "pipeline": "parallel.pipeline",
    "schedule": "parallel.schedule",
    "rank_roles": "parallel.rank_roles",
    # the moments of a step, one rank's result
    "timeline": "step.timeline",
    "moments": "step.moments",
    "lazy_items": "step.lazy_items",
    "rank_estimate": "step.rank_estimate",
    # preference and RL objectives, the rollout phase
    "objectives": "rl.objectives",
    "rollout": "rl.rollout",
    # memoisation by the scenario fields read
    "parts_cache": "caches.parts_cache",
    "model_rules_cache": "caches.model_rules_cache",
}

TEXT_SUFFIXES = {
    ".py",
    ".pyi",
    ".md",
    ".ipynb",
    ".json",
    ".yml",
    ".yaml",
    ".toml",
    ".txt",
    ".cfg",
    ".ini",
    ".csv",
}
TEXT_SUFFIXES |= {".sh", ".rst", ".html"}
MAX_BYTES = 5_000_000
SELF = Path(__file__).resolve()

_NAMES = "|".join(sorted(map(re.escape, MOVES), key=len, reverse=True))
#: ``memsim_widget.engine.X`` / ``memsim_widget/engine/X`` anywhere, or ``engine.X`` / ``engine/X`` with no word,
#: dot, slash or dash before ``engine``; X an old module name ending there (``\b``: ``vision`` is not ``vision_qwen``).
PATH_RE = re.compile(
    rf"(?:(?<!\w)(?P<pre>memsim_widget[./])|(?<![\w./-]))engine(?P<sep>[./])(?P<old>{_NAMES})\b"
)
#: one-line ``from memsim_widget.engine import names`` in Markdown or a notebook's JSON text.
FROM_LINE_RE = re.compile(
    r"(?P<head>from memsim_widget\.engine import )(?P<names>[\w ,]+?)(?=\s*(?:#|\\n|\"|`|$))", re.M
)

#: a new path (``engine/step/timeline``, ``memsim_widget.engine.counters.overhead``).
NEW_PATH_RE = re.compile(
    r"engine[./](?:" + "|".join(re.escape(new.split(".")[0]) for new in MOVES.values()) + r")[./]\w"
)
#: ruff's line length (pyproject.toml).
LINE_LENGTH = 110

if set(MOVES) & {new.split(".")[0] for new in MOVES.values()}:  # would make a rewritten path match again
    raise SystemExit("a new package is named as an old module: the rewrite would not be idempotent")


def _path_sub(m: re.Match[str]) -> str:
    sep, new = m["sep"], MOVES[m["old"]]
    return f"{m['pre'] or ''}engine{sep}{new.replace('.', sep)}"


def rewrite_paths(text: str) -> str:
    """Every dotted or slashed old path in ``text`` replaced by its new one."""
    return PATH_RE.sub(_path_sub, text)


def _prose_spans(source: str) -> list[tuple[int, int]] | None:
    """The character spans of a Python source's strings and comments, or None if it does not tokenize."""
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return None
    return [
        (starts[t.start[0] - 1] + t.start[1], starts[t.end[0] - 1] + t.end[1])
        for t in tokens
        if t.type in (tokenize.STRING, tokenize.COMMENT)
    ]


def rewrite_python_paths(source: str) -> str:
    """``rewrite_paths`` for Python: ``memsim_widget.engine.X`` anywhere, but ``engine.X`` / ``engine/X`` without
    the package only in strings and comments (in code, ``engine.moments`` is an attribute of a variable)."""
    spans = _prose_spans(source)
    if spans is None:
        return rewrite_paths(source)

    def sub(m: re.Match[str]) -> str:
        if m["pre"] or any(a <= m.start() < b for a, b in spans):
            return _path_sub(m)
        return m.group(0)

    new = PATH_RE.sub(sub, source)
    rows = {i for i, (a, b) in enumerate(zip(source.splitlines(), new.splitlines(), strict=True)) if a != b}
    return _lift_long_comments(new, rows) if rows else new


def _lift_long_comments(source: str, rows: set[int]) -> str:
    """A trailing comment on one of ``rows`` (0-based lines the rewrite changed) that cites a new path and leaves
    its line over ``LINE_LENGTH``, moved to its own line above (``ruff format`` would otherwise wrap the code in
    parentheses to make room for it)."""
    spans = _prose_spans(source)
    if spans is None:
        return source
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    for a, b in reversed(spans):
        row = next(i for i in range(len(lines)) if starts[i] <= a < starts[i + 1])
        line, col = lines[row], a - starts[row]
        code = line[:col]
        first = starts[row] + len(code) - len(code.lstrip())
        if (
            row not in rows
            or not source.startswith("#", a)
            or not code.strip()
            or len(line.rstrip("\r\n")) <= LINE_LENGTH
            or not NEW_PATH_RE.search(source, a, b)
            or any(x < first < y for x, y in spans)  # the line starts inside a string
        ):
            continue
        indent = code[: len(code) - len(code.lstrip())]
        lines[row] = f"{indent}{source[a:b]}\n{code.rstrip()}{line[col + (b - a) :]}"
    return "".join(lines)


def _from_lines(names: list[tuple[str, str | None]], indent: str, tail: str) -> list[str] | None:
    """``from memsim_widget.engine... import`` lines for ``names`` ((name, alias)), one per package, or None when
    no name moved."""
    if not any(n in MOVES for n, _ in names):
        return None
    groups: dict[str, list[str]] = {}
    for name, alias in names:
        new = MOVES.get(name)
        package, _, base = (new or name).rpartition(".")
        shown = alias or (name if base != name else None)
        groups.setdefault(f"{ENGINE}.{package}" if package else ENGINE, []).append(
            base if shown is None or shown == base else f"{base} as {shown}"
        )
    return [f"{indent}from {pkg} import {', '.join(items)}{tail}" for pkg, items in groups.items()]


def _package_of(path: Path) -> list[str]:
    """The package a Python file is in: ``memsim_widget/engine/step/timeline.py`` -> ``[memsim_widget, engine,
    step]`` (a package's ``__init__.py``: the package itself)."""
    parts = list(path.resolve().relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts[:-1]


def _exists(dotted: str) -> bool:
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _old_package(path: Path) -> list[str] | None:
    """``[memsim_widget, engine]`` for a moved engine module (where it lived before the move), else None."""
    rel = ".".join(path.resolve().relative_to(ROOT).with_suffix("").parts)
    return ["memsim_widget", "engine"] if rel in {f"{ENGINE}.{new}" for new in MOVES.values()} else None


def _absolute(package: list[str], level: int, module: str | None) -> str:
    """``from {'.' * level}{module} import ...`` written in ``package``, as an absolute module name."""
    return ".".join(package[: len(package) - level + 1] + ([module] if module else []))


def _resolve_relative(path: Path, node: ast.ImportFrom) -> str | None:
    """The absolute module a relative import must name after the move, or None to leave it as written: a moved
    module gets its new path; an import that no longer resolves because its file moved, the module it named."""
    now = _absolute(_package_of(path), node.level, node.module)
    old_package = _old_package(path)
    candidates = [now] + ([_absolute(old_package, node.level, node.module)] if old_package else [])
    for i, target in enumerate(candidates):
        key = target.removeprefix(ENGINE + ".")
        if target.startswith(ENGINE + ".") and key in MOVES:
            return f"{ENGINE}.{MOVES[key]}"
        if node.module is None:  # ``from . import a, b``: a and b are modules of ``target``
            if target == ENGINE and any(a.name in MOVES for a in node.names):
                return ENGINE
            if all(_exists(f"{target}.{a.name}") for a in node.names):
                return target if i else None
        elif _exists(target):
            return target if i else None
    return None


def rewrite_python_imports(path: Path, text: str) -> str:
    """``from memsim_widget.engine import moved`` and relative imports of moved modules, made absolute and new."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, list[str]]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.end_lineno is None:
            continue
        if node.level:
            target = _resolve_relative(path, node)
            if target is None:
                continue
        elif node.module == ENGINE:
            target = ENGINE
        else:
            continue
        first, last = node.lineno - 1, node.end_lineno - 1
        indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
        tail_match = re.search(r"\s*#.*$", lines[last].rstrip("\r\n"))
        tail = (tail_match.group(0) if tail_match else "") + "\n"
        names = [(a.name, a.asname) for a in node.names]
        if target == ENGINE:
            new_lines = _from_lines(names, indent, tail)
            if new_lines is None:
                if not node.level:
                    continue
                new_lines = [f"{indent}from {ENGINE} import {_names(names)}{tail}"]
        else:
            new_lines = [f"{indent}from {target} import {_names(names)}{tail}"]
        edits.append((first, last, new_lines))
    for first, last, new_lines in sorted(edits, reverse=True):
        lines[first : last + 1] = new_lines
    return "".join(lines)


def _names(names: list[tuple[str, str | None]]) -> str:
    return ", ".join(n if a is None else f"{n} as {a}" for n, a in names)


def rewrite_from_lines(text: str, where: str, warnings: list[str]) -> str:
    """One-line ``from memsim_widget.engine import names`` in a non-Python text, when the moved names share a
    package and nothing else is imported with them; otherwise a warning to fix it by hand."""

    def sub(m: re.Match[str]) -> str:
        names = [(p.split(" as ")[0].strip(), None) for p in m["names"].split(",") if p.strip()]
        aliases = [
            p.split(" as ")[1].strip() if " as " in p else None for p in m["names"].split(",") if p.strip()
        ]
        names = [(n, a) for (n, _), a in zip(names, aliases, strict=True)]
        new = _from_lines(names, "", "")
        if new is None:
            return m.group(0)
        if len(new) > 1:
            warnings.append(f"{where}: fix by hand: {m.group(0).strip()}")
            return m.group(0)
        return new[0]

    return FROM_LINE_RE.sub(sub, text)


def rewrite_file(path: Path, warnings: list[str]) -> str | None:
    """The new text of ``path``, or None when nothing changes."""
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    new = text
    if path.suffix in {".py", ".pyi"}:
        new = rewrite_python_imports(path, new)
    else:
        new = rewrite_from_lines(new, str(path.relative_to(ROOT)), warnings)
    new = rewrite_python_paths(new) if path.suffix in {".py", ".pyi"} else rewrite_paths(new)
    if path.suffix == ".ipynb" and new != text:
        json.loads(new)  # the notebook is still JSON (paths have nothing to escape)
    return None if new == text else new


def candidate_files(paths: list[str]) -> list[Path]:
    """Tracked and untracked, not ignored, text files of the repository (under ``paths`` if given)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    files = []
    for name in sorted(set(filter(None, out.split("\0")))):
        p = ROOT / name
        if p.resolve() == SELF or not p.is_file() or p.is_symlink() or p.stat().st_size > MAX_BYTES:
            continue
        if p.suffix in TEXT_SUFFIXES or (p.parent.name == "scripts" and not p.suffix):
            files.append(p)
    return files


def _changed_lines(old: str, new: str) -> list[str]:
    return [
        line.rstrip("\n")
        for line in difflib.unified_diff(old.splitlines(True), new.splitlines(True), n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="files or folders (default: the whole repository)")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything would change")
    ap.add_argument("--no-ruff", action="store_true", help="do not run ruff on the changed Python files")
    ap.add_argument(
        "-q", "--quiet", action="store_true", help="print only the changed files, not their lines"
    )
    args = ap.parse_args(argv)
    warnings: list[str] = []
    changed: list[Path] = []
    for path in candidate_files(args.paths):
        new = rewrite_file(path, warnings)
        if new is None:
            continue
        old = path.read_text(encoding="utf-8")
        changed.append(path)
        print(f"{'would change' if args.check else 'changed'} {path.relative_to(ROOT)}")
        if not args.quiet:
            for line in _changed_lines(old, new):
                print(f"    {line[:200]}")
        if not args.check:
            path.write_text(new, encoding="utf-8")
    for w in warnings:
        print(f"WARNING {w}", file=sys.stderr)
    py = [str(p.relative_to(ROOT)) for p in changed if p.suffix in {".py", ".pyi"}]
    if py and not args.check and not args.no_ruff:
        ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
        if Path(ruff).exists():
            subprocess.run([ruff, "check", "--select", "I", "--fix", "--quiet", *py], cwd=ROOT, check=False)
            subprocess.run([ruff, "format", "--quiet", *py], cwd=ROOT, check=False)
            print(f"ruff: import order fixed and formatted in {len(py)} Python file(s)")
        else:
            print("ruff not found: run `ruff check --select I --fix` and `ruff format` on the files above")
    print(f"{len(changed)} file(s) {'would change' if args.check else 'changed'}; {len(warnings)} warning(s)")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
