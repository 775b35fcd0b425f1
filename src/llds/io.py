"""Small file helpers shared by every module that writes results: writes are atomic."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from llds.errors import DataFormatError, UserInputError, WriteFailedError

NO_SPACE = "no space left on device"
_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_WRITE_ERRNOS = (*_NO_SPACE_ERRNOS, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG)
_NO_SPACE_TEXT = ("no space left", "storagefull", "code: 28", "disk quota")
_WRITER_TEXT = ("file write failed", "unexpected pos", "ioerror", "failed writing", "os error")


def write_failure(exc: BaseException, path: str | os.PathLike[str] | None = None) -> str | None:
    """Why a write failed, when `exc` is a failed write, else None. Writers fail in their own
    ways: Python raises `OSError`, torch's zip writer a `RuntimeError` ("file write failed",
    "unexpected pos"), safetensors a `SafetensorError` naming the OS error. A writer error on a
    file system with no space left (`path`'s) is reported as such."""
    if isinstance(exc, OSError):
        if exc.errno in _NO_SPACE_ERRNOS:
            return NO_SPACE
        return (exc.strerror or type(exc).__name__) if exc.errno in _WRITE_ERRNOS else None
    text = str(exc).lower()
    if not isinstance(exc, RuntimeError) and type(exc).__name__ != "SafetensorError":
        return None
    if any(t in text for t in _NO_SPACE_TEXT):
        return NO_SPACE
    if not any(t in text for t in _WRITER_TEXT):
        return None
    return NO_SPACE if path is not None and _out_of_space(Path(path)) else "the write failed"


def _out_of_space(path: Path, margin: int = 1 << 20) -> bool:
    """Whether the file system holding `path` has (almost) no free space."""
    for p in (path, *path.parents):
        if p.exists():
            try:
                return shutil.disk_usage(p).free < margin
            except OSError:
                return False
    return False


def _advice(kept: str, why: str) -> str:
    """`kept` (what is intact, what to do) with its remedy fitted to `why`: freeing space
    helps only a full disk; a read-only folder or a permission needs the permission fixed."""
    if why == NO_SPACE:
        return kept
    fix = "make it writable (or choose another folder)"
    return kept.replace("free space or fix the permission", fix).replace("free space", fix)


def silent_write_failed(path: str | os.PathLike[str], kept: str) -> WriteFailedError:
    """The error for a writer that failed without raising (it only logged it, or left the file
    short): one line naming `path`, why (no space left, when `path`'s file system has none),
    and `kept`."""
    why = NO_SPACE if _out_of_space(Path(path)) else "the write failed"
    return WriteFailedError(
        f"{path} could not be written ({why}); {_advice(kept, why)}", path=path, why=why
    )


@contextmanager
def failing_writes_stop(path: str | os.PathLike[str], kept: str) -> Iterator[None]:
    """A failed write inside (a full disk, a quota, a permission) becomes one
    `WriteFailedError` line naming `path`, why, and `kept` (what is intact, what to do)."""
    try:
        yield
    except WriteFailedError:
        raise
    except Exception as exc:
        why = write_failure(exc, path)
        if why is None:
            raise
        raise WriteFailedError(
            f"{path} could not be written ({why}); {_advice(kept, why)}", path=path, why=why
        ) from None


@contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temp file beside `path`; rename it over `path` only if the block succeeds.

    A crash or an exception leaves the previous file untouched, never a half-written one.
    """
    target = Path(path)
    kept = "the previous file, if any, is intact"
    with failing_writes_stop(target, kept):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes a private file; give it normal permissions
    try:
        with failing_writes_stop(target, kept):
            with os.fdopen(fd, mode, **kwargs) as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _apply_umask(root: Path) -> None:
    """Temp files are created private (0600/0700); give the index ordinary permissions."""
    mask = os.umask(0)
    os.umask(mask)
    root.chmod(0o777 & ~mask)
    for path in root.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


@contextmanager
def atomic_directory(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp directory beside `target`; on success it replaces `target` (an old
    directory is moved aside first and removed last), on failure it is deleted. Used for every
    directory the project writes whole: indexes, saved models, converted checkpoints."""
    final = Path(os.path.abspath(Path(target).expanduser()))  # `.` has no name to go beside
    if final.exists() and not final.is_dir():
        raise UserInputError(f"{final}: exists and is not a directory")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _apply_umask(tmp)
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_directory_target(key: str, path: str | os.PathLike[str] | None) -> None:
    """Refuse, before any work, an output directory `path` (given as `key`) that already
    exists as something else: a file, say, which writing would otherwise find only at the end,
    in a traceback."""
    if path is None or str(path) == "":
        return
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise UserInputError(
            f"{key}={target}: exists and is not a directory; give a directory to write into"
        )
    existing = next(p for p in (target.absolute(), *target.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == target.absolute() else f" ({existing} is not)"
        raise UserInputError(f"{key}={target}: not writable{where}; give a directory you can write")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """Write `obj` as JSON atomically."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False)
        f.write("\n")


def write_yaml(path: str | os.PathLike[str], obj: Any) -> None:
    """`obj` as YAML (keys in insertion order), atomically."""
    import yaml

    with atomic_write(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(obj, f, sort_keys=False)


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[Any]) -> int:
    """Write one JSON object per line atomically; returns the number of rows."""
    n = 0
    with atomic_write(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False))
            f.write("\n")
            n += 1
    return n


def text_lines(path: Path, handle: IO[bytes]) -> Iterator[tuple[int, str]]:
    """`(line number, text)` of a UTF-8 file opened in binary (or through gzip); a line that is
    not UTF-8, a `.gz` file that is not gzip, or a compressed file cut short is one
    `DataFormatError` naming the file (and line), instead of a decoder traceback."""
    import gzip
    import zlib

    lines = iter(handle)
    line_no = 0
    while True:
        try:
            raw = next(lines)
        except StopIteration:
            return
        except gzip.BadGzipFile:
            raise DataFormatError(
                f"{path}: not a gzip file, though its name ends in .gz; rename it without .gz "
                "(or compress it with gzip)"
            ) from None
        except (EOFError, zlib.error) as exc:
            what = "ends early" if isinstance(exc, EOFError) else "is damaged"
            raise DataFormatError(
                f"{path}: the compressed data {what} after line {line_no} (a copy cut short?); "
                "copy or compress it again"
            ) from None
        line_no += 1
        try:
            yield line_no, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataFormatError(
                f"{path} line {line_no}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                f"{exc.start + 1}); save the file as UTF-8"
            ) from None


def read_text_utf8(path: Path) -> str:
    """A whole UTF-8 text file; not UTF-8 is one `DataFormatError` naming file and byte offset."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataFormatError(
            f"{path} line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); save the file as UTF-8"
        ) from None


# ------------------------------------------------------------------------- claiming an output


def _real(path: str | os.PathLike[str]) -> Path:
    """`path` absolute, `..` and symlinks resolved (so that `W/.` and `W` compare equal)."""
    return Path(os.path.realpath(Path(path).expanduser()))


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_output(
    key: str,
    path: str | os.PathLike[str] | None,
    *,
    inputs: Iterable[tuple[str, str | os.PathLike[str]]] = (),
    owns: Sequence[str] = (),
    overwrite: bool = False,
    command: str = "this command",
    folder: bool = True,
) -> None:
    """Refuse, before any work, an output `path` (given as `key`) whose writing could destroy
    what the command did not write: one that is, holds or contains one of its `inputs`
    (`(key, path)` pairs; never allowed), the working directory or a folder above it, or a
    non-empty folder holding none of `owns` (the names the command's own earlier output holds).
    `overwrite` (the user's `--overwrite`) allows the last two; for a file output (not
    `folder`) only the inputs are checked. Replacing is the writers' business: they write
    beside and rename (`atomic_write`, `atomic_directory`), never delete first."""
    if path is None or str(path) == "":
        return
    target = _real(path)
    for name, given in inputs:
        source = _real(given)
        if _is_within(source, target):
            how = "is" if source == target else "holds" if source.parent == target else "contains"
            raise UserInputError(
                f"{key}={path}: {how} the input {name}={given}, which writing the output "
                "would replace; give an output folder of its own"
            )
    if overwrite or not folder:
        return
    cwd = _real(os.getcwd())
    if _is_within(cwd, target):
        what = "is the working directory" if cwd == target else "holds the working directory"
        raise UserInputError(
            f"{key}={path}: {what}, whose files writing the output could replace; give a new "
            "folder (e.g. runs/NAME), or pass --overwrite to write there anyway"
        )
    if target.is_dir() and not any((target / name).exists() for name in owns):
        entries = sorted(p.name for p in target.iterdir())
        if entries:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise UserInputError(
                f"{key}={path}: a folder with {len(entries)} "
                f"{'entry' if len(entries) == 1 else 'entries'} ({shown}), not an "
                f"earlier output of {command}; give a new or empty folder, or pass --overwrite "
                "if its files may be replaced"
            )
