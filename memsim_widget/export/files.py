"""Writing an export's files into a folder: atomic, all or none, never through a link, never over a file unless
asked (``--force``).

Each file is first written in full to a temporary file in the target folder (same file system, so the rename
is atomic), flushed to disk (``fsync``), and only when every file of the export is staged are they moved into
place: with ``os.link`` (fails if the name exists, so a file created meanwhile is not overwritten either) or,
with ``force``, ``os.replace`` after keeping a hard link to the old file. If any step fails, the files already
placed are removed and the replaced ones put back: the folder holds the whole export or what it held before.
An existing symbolic link at a target name is refused, with or without ``force`` (a link planted in a shared
folder would send the write elsewhere).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from memsim_widget.errors import ScenarioError, check_text, short_repr
from memsim_widget.fast_dataclass import dataclass

#: The mode of written files (a launch config holds no secret; the umask is not read: it is process-wide).
FILE_MODE = 0o644


@dataclass
class _Staged:
    """One file of the export on its way: its temporary copy, its target, and the old file kept aside."""

    name: str
    target: Path
    temp: Path
    backup: Path | None = None
    placed: bool = False


def write_files(
    files: Mapping[str, str], out: str | Path, *, force: bool = False, field: str = "--out"
) -> list[Path]:
    """Write ``{file name: text}`` into the folder ``out`` (created if missing); return the written paths.

    Refuses (a ScenarioError on ``field``, nothing written or changed) a name that is not a plain file name,
    text that is not encodable as UTF-8, a target that is a symbolic link or not a regular file, an existing
    file unless ``force``, and any failure of the file system (full disk, size limit, permissions).
    """
    data = _encode(files, field)
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise ScenarioError(field, f"cannot write to {short_repr(str(out))}: {_why(exc)}") from None
    if not folder.is_dir():
        raise ScenarioError(field, f"cannot write to {short_repr(str(out))}: not a folder")
    for name in data:
        _check_target(folder / name, force, field)
    staged: list[_Staged] = []
    current = ""
    try:
        for current, raw in data.items():
            staged.append(_stage(folder, current, raw))
        for item in staged:
            current = item.name
            _place(item, force)
        _sync_folder(folder)
    except OSError as exc:
        _roll_back(staged)
        raise ScenarioError(
            field, f"cannot write to {short_repr(str(out))}: {current}: {_why(exc)}; nothing was written "
            "(files already there are unchanged)"
        ) from None  # fmt: skip
    except BaseException:
        _roll_back(staged)
        raise
    for item in staged:
        _remove(item.backup)
    return [item.target for item in staged]


def _encode(files: Mapping[str, str], field: str) -> dict[str, bytes]:
    """Every file as UTF-8 bytes, before anything touches the disk; names checked as plain file names."""
    data: dict[str, bytes] = {}
    for name, text in files.items():
        check_text(field, name)
        if name in ("", ".", "..") or "/" in name or "\\" in name or name.startswith("."):
            raise ScenarioError(field, f"{name!r} is not a plain file name")
        try:
            data[name] = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ScenarioError(
                field,
                f"{name} holds {ascii(exc.object[exc.start : exc.end])}, not UTF-8 text; nothing was written",
            ) from None
    return data


def _check_target(target: Path, force: bool, field: str) -> None:
    """Refuse a link or a non-regular file at ``target``, and an existing file unless ``force``."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ScenarioError(field, f"cannot check {target}: {_why(exc)}") from None
    if stat.S_ISLNK(st.st_mode):
        raise ScenarioError(
            field,
            f"{target} is a symbolic link; memsim does not write through links (remove it or pick another folder)",
        )
    if not stat.S_ISREG(st.st_mode):
        raise ScenarioError(field, f"{target} exists and is not a regular file")
    if not force:
        raise ScenarioError(field, f"{target} exists; pass --force to replace it (nothing was written)")


def _stage(folder: Path, name: str, raw: bytes) -> _Staged:
    """Write ``raw`` to a new temporary file beside the target and flush it to disk."""
    fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), FILE_MODE)
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _remove(Path(temp))
        raise
    return _Staged(name, folder / name, Path(temp))


def _place(item: _Staged, force: bool) -> None:
    """Move a staged file to its name: never over a file created meanwhile; with ``force`` the old one is
    kept aside (``backup``) until the whole export is in place."""
    if force and os.path.lexists(item.target):
        if os.path.islink(item.target):  # planted after the check
            raise FileExistsError(17, "a symbolic link appeared at the target", str(item.target))
        backup = Path(f"{item.temp}.old")
        try:
            os.link(item.target, backup)
        except OSError:  # no hard links on this file system: move the old file aside instead
            os.replace(item.target, backup)
        item.backup = backup
        os.replace(item.temp, item.target)
        item.placed = True
        return
    try:
        os.link(item.temp, item.target)  # fails when the name exists: nothing is overwritten
    except FileExistsError:
        raise
    except OSError:  # no hard links here (FAT, some network mounts): check, then rename
        if os.path.lexists(item.target):
            raise FileExistsError(17, "File exists", str(item.target)) from None
        os.replace(item.temp, item.target)
    item.placed = True
    _remove(item.temp)


def _roll_back(staged: list[_Staged]) -> None:
    """Undo a failed export: placed files removed (or their old file put back), temporary files deleted."""
    for item in reversed(staged):
        if item.placed:
            with contextlib.suppress(OSError):
                if item.backup is not None:
                    os.replace(item.backup, item.target)
                    item.backup = None
                else:
                    os.unlink(item.target)
        _remove(item.temp)
        _remove(item.backup)


def _remove(path: Path | None) -> None:
    """Delete a temporary file if it is there."""
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _sync_folder(folder: Path) -> None:
    """Flush the folder's entries (the renames) to disk, where the platform allows opening a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _why(exc: BaseException) -> str:
    """An OSError's own words (``No space left on device``, ``File too large``)."""
    return str(getattr(exc, "strerror", None) or exc)
