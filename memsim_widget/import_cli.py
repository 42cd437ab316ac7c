"""The command-line face of import: ``memsim import FILE...`` and the ``--from FILE...`` of estimate, plan,
recommend and measure. The scenario goes to stdout; the settings no file gave go to stderr, one line each.

It lives outside ``memsim_widget.importers`` because the CLI builds its parser from it on every start: importing
anything under ``importers`` runs that package's face, which loads every reader, YAML and the engine (about 50 ms
of ``memsim --help``, benchmarks/cli_startup.py); the readers are imported when a file is read."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

FORMAT_CHOICES = (
    "auto",
    "deepspeed",
    "accelerate",
    "hf",
    "axolotl",
    "llamafactory",
    "torchtune",
    "torchtitan",
)


def print_unread(lines: list[str]) -> None:
    """The unread settings on stderr (stdout keeps the JSON), under one heading line."""
    if not lines:
        return
    print("memsim: settings not in the files (memsim's assumption follows each):", file=sys.stderr)
    for line in lines:
        print(f"  - {line}", file=sys.stderr)


def imported_base(files: list[str], fmt: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The scenario dict of ``--from FILE...`` (the flags applied), its unread settings printed."""
    from memsim_widget.importers import import_config

    imported = import_config(files, fmt, overrides)
    print_unread(imported.unread)
    return imported.scenario.to_dict()


def add_from(p: argparse.ArgumentParser) -> None:
    """``--from FILE...`` and ``--from-format`` on a subcommand that reads a scenario."""
    p.add_argument("--from", dest="from_files", nargs="+", metavar="FILE",
                   help="read the scenario from your launch config files (axolotl, LLaMA-Factory, torchtune, "
                   "torchtitan, accelerate + DeepSpeed, TrainingArguments); see memsim import")  # fmt: skip
    p.add_argument("--from-format", dest="from_format", default="auto", choices=FORMAT_CHOICES, metavar="FORMAT",
                   help="the files' format (default auto: detected per file)")  # fmt: skip


def add_import(sub: argparse._SubParsersAction, add_overrides: Callable[[argparse.ArgumentParser], None],
               run: Callable[[argparse.Namespace], int]) -> None:  # fmt: skip
    """The ``import`` subcommand."""
    p = sub.add_parser(
        "import",
        help="read your launch config files as a scenario (prints its JSON)",
        description="Read one job's launch config files (an axolotl or LLaMA-Factory YAML, a torchtune config or "
        "tune run script, a torchtitan config_registry .py or TOML, an accelerate config with its DeepSpeed JSON, "
        "HF TrainingArguments JSON/YAML, a model's config.json) and print the scenario JSON. Every setting that "
        "changes memory and is not in the files is listed on stderr with memsim's assumption; flags set them. "
        "Nothing is downloaded or executed. Details: docs/import.md.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="the job's files (FILE.py:FUNCTION picks a torchtitan "
                   "config function)")  # fmt: skip
    p.add_argument("--format", default="auto", choices=FORMAT_CHOICES, metavar="FORMAT",
                   help="one of: " + ", ".join(FORMAT_CHOICES) + " (default auto)")  # fmt: skip
    add_overrides(p)
    p.set_defaults(func=run)


def cmd_import(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    """Print the imported scenario's JSON; the unread settings on stderr."""
    from memsim_widget.importers import import_config

    imported = import_config(args.files, args.format, overrides)
    print(json.dumps(imported.scenario.to_dict(), indent=2))
    print_unread(imported.unread)
    return 0
