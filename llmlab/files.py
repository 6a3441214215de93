"""Files that must never be half-written, half-read or written twice at once.

- `owned_tmp_dir`: a temporary directory named after the host and PID that made it, so a
  later run can tell a dead writer's leftovers (`clean_stale`) from a live writer's work.
- `HolderLock`, `RunLock`: one writer at a time in a run directory; a second one is told who
  holds it.
- `read_kept`, `write_kept`: a small JSON object of measurements kept in the llmlab cache
  (a matmul peak, decoding layouts), read as a file a user may have edited by hand.
- `disk_error`: an OSError (or a library's wrapped one) from a full disk, a file-size limit
  or a read-only directory, as one line that says which file and what to do.
- `atomic_write_text`, `atomic_write_bytes`, `open_append`, `own_dir`, `release`: the one rule
  for writing into a folder llmlab did not just create (a run, sweep, report, eval or export
  folder, a cache entry), which may come from elsewhere with links planted in it. A link is
  never written through: a whole file goes to a fresh temporary name and is renamed over the
  name (replacing a link, not following it), an append opens without following links, and a
  folder that is a link out of its parent is refused. Each link replaced is said in one line.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
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
    """``path`` holds the old text or the new, never a part of either; a link at ``path`` is
    replaced, never written through (`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a fresh temporary file beside ``path`` (created with O_EXCL, so a link
    planted under a guessed temporary name is never followed), then rename it over ``path``:
    a symbolic or hard link there is replaced by the new file, and its target keeps its bytes."""
    path = Path(path)
    was_link = _link_target(path)
    fd, tmp = _exclusive_tmp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if was_link is not None:
        say_replaced(path, was_link)


def _exclusive_tmp(path: Path) -> tuple[int, Path]:
    """A new file beside ``path`` under a random name, made with O_EXCL|O_NOFOLLOW (nothing
    planted there is opened) and the mode a plain open gives (0666 less the umask)."""
    import secrets

    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.with_name(f".{path.name[:100]}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


def _link_target(path: Path) -> str | None:
    """What ``path`` links to, when it is a symbolic link or a name of a file with others
    (a hard link); None for a plain file, a directory or nothing."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return os.readlink(path)
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        return f"a file with {st.st_nlink - 1} other name(s)"
    return None


def say_replaced(path: Path, target: str) -> None:
    """The one line for a link llmlab replaced instead of writing through it."""
    from llmlab import console

    console.err.print(f"{path}: was a link ({target}); written as a file of its own, the link's target left as it "
                      "was", style="yellow")


def release(path: Path) -> None:
    """Make ``path`` safe for a writer that opens it by name (Hydra's own files): a symbolic
    link or a hard-linked name there is removed, and said in one line; a plain file or nothing
    is left as it is. Anything else (a folder, a pipe) is left for the writer to refuse."""
    path = Path(path)
    target = _link_target(path)
    if target is None:
        return
    path.unlink()
    say_replaced(path, target)


_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
    | getattr(os, "O_CLOEXEC", 0)


def open_append(path: Path, buffering: int = -1, encoding: str = "utf-8", mode: str = "a"):
    """``path`` opened to append text (``mode`` "a", or "a+" to read it too), without following
    a link: a symbolic link or a hard-linked name there is removed first (said in one line) and
    the file begins anew; a folder or a pipe in its place is one line (UserError)."""
    path = Path(path)
    flags = _APPEND if mode == "a" else (_APPEND & ~os.O_WRONLY) | os.O_RDWR
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.EMLINK, errno.ENXIO):
            raise  # a folder in its place (EISDIR) is `disk_error`'s line
        if e.errno != errno.ELOOP:
            raise UserError(f"{path}: not a regular file; move it aside so llmlab can write its own") from None
        fd = None
    if fd is not None:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return os.fdopen(fd, mode, buffering=buffering, encoding=encoding)
        os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path}: not a regular file; move it aside so llmlab can write its own")
    target = _link_target(path)
    path.unlink()
    fd = os.open(path, flags | os.O_EXCL, 0o666)
    say_replaced(path, target or "a link")
    return os.fdopen(fd, mode, buffering=buffering, encoding=encoding)


def open_fresh(path: Path):
    """``path`` made anew for binary writing: whatever name stands there is removed first (a
    link said in one line, never followed), and the new file is created exclusively."""
    path = Path(path)
    target = _link_target(path)
    if target is not None or path.is_file():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                 0o666)
    if target is not None:
        say_replaced(path, target)
    return os.fdopen(fd, "wb")


def link_out(path: Path) -> str | None:
    """Where ``path`` leads when it is a symbolic link out of its parent folder; None when it
    is no link, or a link that stays inside its parent."""
    path = Path(path)
    if not path.is_symlink():
        return None
    target = os.path.realpath(path)
    parent = os.path.realpath(path.parent)
    if target != parent and os.path.commonpath([target, parent]) == parent:
        return None
    return target


def own_dir(path: Path, key: str | None = None) -> Path:
    """Make the folder ``path`` (and its parents) for llmlab to write into, refusing one that
    is a symbolic link out of its parent (UserError naming ``key``, or the folder)."""
    path = Path(path)
    target = link_out(path)
    if target is not None:
        raise UserError(f"{key + ': ' if key else ''}{path} is a link out of its folder (to {target}); llmlab does "
                        "not write through links: move it aside, or choose another folder")
    path.mkdir(parents=True, exist_ok=True)
    return path


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

        release(self.path)  # a link planted as the lock file: filelock would open (or truncate) its target
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return False
        self._mark()
        return True

    def acquire(self) -> "HolderLock":
        """Wait for the lock as long as it takes."""
        release(self.path)
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
