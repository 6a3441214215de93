"""Files that must never be half-written, half-read or written twice at once.

- `owned_tmp_dir`: a temporary directory named after the host and PID that made it, so a
  later run can tell a dead writer's leftovers (`clean_stale`) from a live writer's work.
- `HolderLock`, `RunLock`: one writer at a time in a run directory; a second one is told who
  holds it.
- `read_kept`, `write_kept`: a small JSON object of measurements kept in the llmlab cache
  (a matmul peak, decoding layouts), read as a file a user may have edited by hand.
- `disk_error`: an OSError (or a library's wrapped one) from a full disk, a file-size limit
  or a read-only directory, as one line that says which file and what to do.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import tempfile
from pathlib import Path

from llmlab.errors import UserError

TMP = ".tmp-"
OLD = ".old-"  # a complete directory moved aside while its replacement goes in
_HOST = socket.gethostname().replace("-", "_")[:32] or "host"
# errnos a user fixes by freeing space, raising a limit or choosing another directory
DISK_ERRNOS = {errno.ENOSPC: "the device is full", errno.EDQUOT: "the disk quota is exhausted",
               errno.EFBIG: "the file-size limit was reached", errno.EROFS: "the file system is read-only",
               errno.EACCES: "permission denied", errno.EPERM: "permission denied",
               # a run directory edited by hand: move the one in the way aside
               errno.EISDIR: "a directory stands where a file belongs",
               errno.ENOTDIR: "a file stands where a directory belongs",
               # mkdir(exist_ok=True) where a file has the directory's name (export out=<file>/x)
               errno.EEXIST: "a file stands where a directory belongs"}
# how libraries that wrap the OS error (torch's zip writer, safetensors) word the same failures
_MESSAGES = {"no space left": "the device is full", "file too large": "the file-size limit was reached",
             "quota exceeded": "the disk quota is exhausted", "read-only file system": "the file system is read-only",
             "unexpected pos": "the device is full or the file-size limit was reached",
             "permission denied": "permission denied"}


def atomic_write_text(path: Path, text: str) -> None:
    """``path`` holds the old text or the new, never a part of either."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_kept(path: Path, what: str, usable, allowed: str) -> tuple[dict, str | None]:
    """The usable entries of ``path``, a JSON object of measurements kept by key, and one line
    on what in it could not be used (None: all of it, or no file yet), for the caller to
    finish with what became of the file. ``what``: what is measured again in their place
    ("the matmul peak"); ``usable(value)``: whether an entry's value can be used; ``allowed``:
    what a usable value is, for the line."""
    import json

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) else "not JSON"
        return {}, f"{path}: {why}; {what} is measured again"
    if not isinstance(data, dict):
        return {}, f"{path}: not a JSON object; {what} is measured again"
    known = {k: v for k, v in data.items() if usable(v)}
    bad = [k for k in data if k not in known]
    if not bad:
        return known, None
    return known, (f"{path}: {len(bad)} entr{'y' if len(bad) == 1 else 'ies'} not {allowed} "
                   f"(first: {bad[0][:60]!r}); measured again")


def what_became(damaged: str, written: bool) -> str:
    """``read_kept``'s line on a damaged file, finished with what `write_kept` did with it."""
    return f"{damaged}, and the file {'written anew' if written else 'cannot be written'}"


def write_kept(path: Path, known: dict) -> bool:
    """Write ``known`` to ``path`` whole (`atomic_write_text`); False where the cache cannot be
    written (read-only, full): that costs a measurement per run, nothing else."""
    import json

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(known, indent=1) + "\n")
    except OSError:
        return False
    return True


def owned_name(label: str, kind: str = TMP) -> str:
    """``<kind><host>-<pid>-<label>-``: the start of a name that says which process owns it."""
    return f"{kind}{_HOST}-{os.getpid()}-{label}-"


def owned_tmp_dir(parent: Path, label: str) -> Path:
    """``parent/.tmp-<host>-<pid>-<label>-<random>``: a fresh directory whose name says who writes it."""
    return Path(tempfile.mkdtemp(prefix=owned_name(label), dir=parent))


def replace_dir(tmp: Path, final: Path, fsync: bool = True) -> None:
    """Put the finished directory ``tmp`` in place as ``final``. An existing ``final`` is
    moved aside under an owned ``.old-`` name first and deleted once the new one is in, so at
    every instant one complete copy exists under a name the next run knows (a checkpoint's
    `recover_checkpoints` restores it). ``fsync``: make the files durable before they become
    visible."""
    tmp, final = Path(tmp), Path(final)
    if fsync:
        for f in tmp.iterdir():
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
    if final.exists():
        old = final.parent / (owned_name(final.name, OLD) + "replaced")
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


def writer_alive(name: str, kind: str = TMP) -> bool:
    """Whether the process that made the entry ``name`` (see `owned_name`) still runs. A name
    from another host, or of another form, counts as alive: only what is provably dead goes."""
    rest = name[len(kind):].split("-")
    if not name.startswith(kind) or len(rest) < 3 or rest[0] != _HOST or not rest[1].isdigit():
        return True
    pid = int(rest[1])
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def clean_stale(parent: Path, kind: str = TMP) -> list[Path]:
    """Remove the ``owned_tmp_dir`` entries under ``parent`` whose writer has died; return them."""
    removed = []
    if not Path(parent).is_dir():
        return removed
    for p in Path(parent).iterdir():
        if p.name.startswith(kind) and not p.is_symlink() and p.is_dir() and not writer_alive(p.name, kind):
            shutil.rmtree(p, ignore_errors=True)
            if not p.exists():
                removed.append(p)
    return removed


def disk_problem(err: BaseException) -> str | None:
    """What a write failure means for the user, when it is the disk's doing (else None)."""
    for e in (err, err.__cause__, err.__context__):
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            return DISK_ERRNOS[e.errno]
    text = str(err).lower()
    for needle, meaning in _MESSAGES.items():
        if needle in text:
            return meaning
    return None


def disk_error(err: BaseException, what: str, hint: str = "") -> UserError | None:
    """A one-line UserError for a disk failure while writing ``what``, or None for other errors."""
    meaning = disk_problem(err)
    if meaning is None:
        return None
    name = getattr(err, "filename", None)
    where = f" ({name})" if name else ""
    return UserError(f"cannot write {what}{where}: {meaning}{'; ' + hint if hint else ''}")


class HolderLock:
    """An exclusive lock on ``path`` for as long as this process holds it: filelock's, which on
    Linux and macOS is ``flock``, dropped by the kernel when the holder dies, even by kill -9.
    The holder's PID goes in a file beside it (``<path>.pid``), so a contender can say who
    holds it."""

    def __init__(self, path: Path):
        from filelock import FileLock

        self.path = Path(path)
        self.pid_file = self.path.with_name(self.path.name + ".pid")
        self._lock = FileLock(str(self.path), thread_local=False, is_singleton=False)

    def try_acquire(self) -> bool:
        """Take the lock if it is free; False if another process holds it."""
        from filelock import Timeout

        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return False
        self._mark()
        return True

    def acquire(self) -> "HolderLock":
        """Wait for the lock as long as it takes."""
        self._lock.acquire()
        self._mark()
        return self

    def _mark(self) -> None:
        atomic_write_text(self.pid_file, f"{os.getpid()}\n")

    def holder(self) -> str:
        """The PID of the process that holds it (``unknown`` when it has not said yet)."""
        try:
            text = self.pid_file.read_text(errors="replace").strip()
        except OSError:
            return "unknown"
        return text if text.isdigit() and len(text) <= 10 else "unknown"  # a PID, or nothing said

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def release(self) -> None:
        if self._lock.is_locked:
            self.pid_file.unlink(missing_ok=True)
            self._lock.release()


class RunLock:
    """One trainer per run directory, for its whole life (a `HolderLock` on ``.lock``)."""

    def __init__(self, run_dir: Path, key: str = "hydra.run.dir"):
        self.key = key
        self._lock = HolderLock(Path(run_dir) / ".lock")

    def acquire(self) -> "RunLock":
        if not self._lock.try_acquire():
            raise UserError(f"{self.key}: {self._lock.path.parent} is in use by another llmlab train "
                            f"(PID {self._lock.holder()}); wait for it to end, or use another hydra.run.dir")
        return self

    @property
    def held(self) -> bool:
        """True while this process holds the lock: then no other llmlab writes here."""
        return self._lock.held

    def release(self) -> None:
        self._lock.release()


def checkpoint_arg(path, key: str = "ckpt") -> Path | None:
    """A checkpoint setting (``ckpt=``, ``draft=``) as given, checked without torch, so a
    mistyped path is one line before a command loads it: None for ``latest`` (found among the
    runs later), else the path, which must exist."""
    if path is None or str(path) in ("", "None", "???"):
        raise UserError(f"{key}: no checkpoint given; pass {key}=<checkpoint dir or run dir>")
    if str(path) == "latest":
        return None
    p = Path(os.path.expanduser(str(path)))
    if not p.exists():
        raise UserError(f"{key}: {p} does not exist")
    return p
