"""One writer per run directory: a lock held by the training process for as long as it runs.

The lock is an advisory `flock` on a hidden file beside the run directory (`runs/.NAME.lock` for
`runs/NAME`): beside it, not inside, because `--no-resume` renames the directory aside and the
name is what two runs would fight over. The kernel releases a `flock` when its process exits in
any way, SIGKILL included, so a lock can never outlive its holder. The file keeps the holder's
PID while it runs and is removed on a clean release (while still locked); a file found with a
PID in a lock that is free again is therefore a holder that died, and taking the lock over says
so. A process that opened the file just before its holder removed it would lock a file no
longer at the path: `acquire` checks that the file it locked is the one at the path, and
otherwise starts again. `flock` is local to one machine:
on a network file system shared by several machines it may not exclude a writer on another one.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import TracebackType

from llds.errors import UserInputError, WriteFailedError
from llds.io import failing_writes_stop

log = logging.getLogger("llds.train")


class RunDirectoryLocked(UserInputError):
    """Another live process trains into the same run directory."""


def lock_path(run_dir: str | Path) -> Path:
    """`runs/NAME` -> `runs/.NAME.lock`."""
    run = Path(run_dir).expanduser().absolute()
    return run.with_name(f".{run.name}.lock")


class RunLock:
    """`with RunLock(run_dir): train()`: refuses to start while another process holds it."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = lock_path(run_dir)
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock and write the holder's PID into its file. A write that fails there (a
        full disk) is one line, and leaves no lock file behind."""
        kept = "nothing in the run directory was changed: free space, then run the same command"
        try:
            with failing_writes_stop(self.path, kept):
                return self._acquire()
        except WriteFailedError:
            self.release()
            raise

    def _acquire(self) -> RunLock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                raise RunDirectoryLocked(
                    f"run_dir {self.run_dir} is in use by another training process "
                    f"({holder or 'PID unknown'}; lock {self.path}); wait for it to finish or "
                    "use another run_dir"
                ) from None
            if is_current(fd, self.path):
                break
            os.close(fd)  # its holder removed it after we opened it: lock the path's file
        stale = _read(fd)
        if stale:
            log.warning(
                "run_dir %s: taking over the lock of %s, which ended without releasing it",
                self.run_dir,
                stale,
            )
        self._fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"PID {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        os.fsync(fd)
        return self

    def release(self) -> None:
        """Remove the file (a clean end leaves nothing behind) and drop the lock."""
        if self._fd is None:
            return
        import fcntl

        try:
            os.ftruncate(self._fd, 0)  # if the removal fails: an empty file, not a dead holder
            if is_current(self._fd, self.path):
                self.path.unlink()
        except OSError as exc:
            log.warning(
                "run_dir %s: could not remove the lock file %s: %s", self.run_dir, self.path, exc
            )
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def is_current(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is the file now at `path` (not one removed or replaced)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


def _read(fd: int) -> str:
    return os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
