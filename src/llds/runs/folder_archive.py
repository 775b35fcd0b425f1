"""A folder as one `.tar.gz` file and back, each side all or nothing.

Studies keep a few folders that are costly or impossible to make again (a run's newest
checkpoint, so that a run longer than one machine's life resumes on the next; a warm start that
other CPU kernels would train into another model) as committed archives. Packing writes a temp
file and renames it; unpacking fills a temp folder and renames it, so a crash leaves either the
old state or the new one. The same folder packs to the same bytes (sorted members, no times or
owners), so an unchanged archive is no change to commit.
"""

from __future__ import annotations

import gzip
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

from llds.errors import UserInputError
from llds.io import atomic_directory, atomic_write, failing_writes_stop

MemberFilter = Callable[[Path], bool]
"""Whether to keep a member, given its path relative to the folder."""


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_folder(
    folder: str | os.PathLike[str],
    archive: str | os.PathLike[str],
    keep: MemberFilter | None = None,
) -> Path:
    """Write `folder`'s files (those `keep` accepts; a rejected directory drops all it holds)
    into `archive`, replacing it only once complete."""
    src, out = Path(folder), Path(archive)
    if not src.is_dir():
        raise UserInputError(f"{src}: no such folder to archive")

    def member(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return _normalized(info) if keep is None or keep(Path(info.name)) else None

    with (
        atomic_write(out, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for child in sorted(src.iterdir()):
            tar.add(child, arcname=child.name, filter=member)
    return out


def unpack_folder(archive: str | os.PathLike[str], folder: str | os.PathLike[str]) -> Path:
    """Make `folder` from `archive`. An existing `folder` is never touched: it is refused."""
    src, dst = Path(archive), Path(folder)
    if not src.is_file():
        raise UserInputError(f"{src}: no such archive")
    if dst.exists():
        raise UserInputError(f"{dst}: already exists; not unpacking {src} over it")
    with (
        failing_writes_stop(dst, f"nothing was unpacked; {src} is intact"),
        atomic_directory(dst) as tmp,
        tarfile.open(src, "r:gz") as tar,
    ):
        tar.extractall(tmp, filter="data")
    return dst
