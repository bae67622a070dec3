"""How the local log puts files on disk so that a writer killed at any instant leaves nothing half-visible.

Every file is written under a temporary name ``.tmp-<pid>-<random>`` (a directory being built outside the
writers' lock, a snapshot, is ``.tmp-snap-<pid>-<random>``), synced, and renamed into place. A killed
writer leaves its temporary behind; :func:`remove_dead_temporaries` removes it later, under the writers'
lock, once the process named in it is gone or the temporary is older than :data:`STALE_TMP_SECONDS`
(that age covers a pid reused by an unrelated process).

:func:`fault` is the crash tests' hook: with ``CDC_LOCAL_LOG_FAULT=<point>`` in its environment a process
kills itself with SIGKILL when it reaches ``point`` (``<point>:stop`` stops it with SIGSTOP instead), so a
test can stop a writer exactly between two steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

FAULT_ENV = "CDC_LOCAL_LOG_FAULT"
STALE_TMP_SECONDS = 24 * 3600
_TEMP = re.compile(r"^\.tmp-(?:snap-)?(\d+)-")


def fault(point: str) -> None:
    spec = os.environ.get(FAULT_ENV)
    if spec is None:
        return
    name, _, action = spec.partition(":")
    if name == point:
        os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)


def write_atomic(path: Path, data: bytes | memoryview, before_rename: str | None = None) -> None:
    """Write ``data`` to ``path`` so that readers see the whole file or none of it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{os.getpid()}-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if before_rename:
            fault(before_rename)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def make_temp_dir(parent: Path, kind: str) -> Path:
    return Path(tempfile.mkdtemp(dir=parent, prefix=f".tmp-{kind}-{os.getpid()}-"))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_dead_temporaries(dirs: Iterable[Path]) -> int:
    """Remove the temporaries in ``dirs`` whose maker is gone or that are stale; return how many.

    Call only under the writers' lock: the lock guarantees no writer of this log is between creating a
    temporary and renaming it, so a live pid can only be a snapshot builder (or a reused pid).
    """
    removed = 0
    now = time.time()
    for d in dirs:
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            continue
        for name in names:
            m = _TEMP.match(name)
            if not m:
                continue
            path = d / name
            try:
                age = now - path.lstat().st_mtime
            except FileNotFoundError:
                continue
            if age < STALE_TMP_SECONDS and _alive(int(m.group(1))):
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            log.info("removed %s, left by a writer that is gone (pid %s)", path, m.group(1))
            removed += 1
    return removed
