"""What a killed save leaves behind, and how the next run finishes it.

A checkpoint is complete when its ``manifest.json``, written last, lists files that are all
there at their recorded sizes (`completeness`); a save writes to an owned temporary directory
and renames it, and a re-save moves the old copy aside first (`llmlab.files.replace_dir`). A
kill at any instant therefore leaves one complete copy under a name `recover_checkpoints`
knows, and the run directory's one writer puts it back before it trains.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from llmlab.files import OLD, TMP, writer_alive

REQUIRED = ("model.safetensors", "model.json", "state.json", "config.yaml", "tokenizer.json")
MANIFEST = "manifest.json"
STEP_IN_NAME = re.compile(r"step_(\d+)")  # a checkpoint's name, or a leftover's that carries it


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not possible on every platform
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def completeness(path: Path, legacy: bool = True) -> str | None:
    """None when ``path`` is a complete checkpoint, else what is wrong. Complete means: the
    manifest, written last, lists files that are all there at their recorded sizes.
    Checkpoints from before manifests count when every required file is there (``legacy``);
    a save's temporary directory never does, since a save killed while copying its last
    required file leaves every name in place with less than its content."""
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.is_file() and not legacy:
        return "no manifest.json: its save did not finish"
    if not manifest.is_file():
        missing = [f for f in REQUIRED if not (path / f).is_file()]
        return f"no manifest.json, and missing {', '.join(missing)}" if missing else None
    try:
        files = json.loads(manifest.read_text())["files"]
        files = {str(k): int(v) for k, v in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "its manifest.json is unreadable"
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            return f"missing {name}"
        if f.stat().st_size != size:
            return f"{name} is truncated or corrupt: {f.stat().st_size:,} bytes, not the {size:,} its manifest records"
    missing = [f for f in REQUIRED if f not in files]
    return f"its manifest lacks {', '.join(missing)}" if missing else None


def recover_checkpoints(ckpt_root: Path, locked: bool = True) -> list[str]:
    """Called by the run directory's one writer before it trains: finish what a killed save
    left half done. A complete copy under a temporary name (``.tmp-``: written, not yet
    renamed; ``.old-``: moved aside for a re-save) takes the place of a missing or incomplete
    ``step_N``; the rest of the leftovers go. ``locked``: the run's lock is held for real
    (`RunLock.held`), which proves that no writer on another host is at work here; without it,
    other hosts' temporaries stay (on a shared file system their writers may be alive). A
    symbolic link is never followed or removed. Returns what it did, for the log."""
    ckpt_root = Path(ckpt_root)
    if not ckpt_root.is_dir():
        return []
    done = []
    leftovers = [p for p in ckpt_root.iterdir() if p.name.startswith((TMP, OLD))]
    for p in [p for p in leftovers if p.is_symlink()]:
        done.append(f"left {p.name} alone: it is a symbolic link, not a directory llmlab wrote")
    leftovers = [p for p in leftovers if not p.is_symlink() and p.is_dir()
                 and (locked or not writer_alive(p.name, OLD if p.name.startswith(OLD) else TMP))]
    leftovers.sort(key=lambda p: (not p.name.startswith(TMP), -p.stat().st_mtime))  # the newer copy first
    for p in leftovers:
        m = STEP_IN_NAME.search(p.name)
        if m and completeness(p, legacy=not p.name.startswith(TMP)) is None:
            target = ckpt_root / m.group(0)
            if not target.exists() or completeness(target) is not None:
                if target.is_symlink():
                    done.append(f"kept {p.name}: {target.name} is a symbolic link, which llmlab does not replace")
                    continue
                if target.exists():
                    shutil.rmtree(target)
                os.rename(p, target)
                done.append(f"restored {target.name} from {p.name}")
    for p in leftovers:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            done.append(f"could not remove the leftover {p.name}" if p.exists() else f"removed the leftover {p.name}")
    if done:
        fsync_dir(ckpt_root)
    return done
