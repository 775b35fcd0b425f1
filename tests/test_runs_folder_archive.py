"""`llds.runs.folder_archive`: a folder to one .tar.gz and back, byte for byte, the same bytes
for the same folder, and all or nothing on a real full disk (a small tmpfs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import leave_free, mounted_tmpfs
from llds.errors import UserInputError, WriteFailedError
from llds.runs.folder_archive import pack_folder, unpack_folder


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _folder(root: Path) -> Path:
    (root / "checkpoints" / "step_2" / "model").mkdir(parents=True)
    (root / "checkpoints" / "step_1").mkdir(parents=True)
    (root / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n', encoding="utf-8")
    (root / "checkpoints" / "step_2" / "model" / "w.bin").write_bytes(os.urandom(3000))
    (root / "checkpoints" / "step_1" / "old.bin").write_bytes(b"old")
    (root / "empty").mkdir()
    return root


def test_a_folder_comes_back_byte_for_byte_without_what_the_filter_drops(tmp_path: Path) -> None:
    src = _folder(tmp_path / "run")

    def keep(rel: Path) -> bool:
        return rel.parts[:2] != ("checkpoints", "step_1")

    archive = pack_folder(src, tmp_path / "a" / "run.tar.gz", keep)
    out = unpack_folder(archive, tmp_path / "back" / "run")
    want = {k: v for k, v in _files(src).items() if not k.startswith("checkpoints/step_1")}
    assert _files(out) == want and "checkpoints/step_2/model/w.bin" in want
    assert (out / "empty").is_dir() and not (out / "checkpoints" / "step_1").exists()
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == ["run"]  # no temp folder


def test_the_same_folder_packs_to_the_same_bytes(tmp_path: Path) -> None:
    src = _folder(tmp_path / "run")
    first = pack_folder(src, tmp_path / "1.tar.gz").read_bytes()
    os.utime(src / "metrics.jsonl", (1, 1))  # times are not recorded
    assert pack_folder(src, tmp_path / "2.tar.gz").read_bytes() == first
    (src / "metrics.jsonl").write_text('{"step": 1}\n', encoding="utf-8")
    assert pack_folder(src, tmp_path / "3.tar.gz").read_bytes() != first


def test_bad_paths_are_refused_with_one_line_naming_them(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=f"{tmp_path / 'none'}: no such folder to archive"):
        pack_folder(tmp_path / "none", tmp_path / "x.tar.gz")
    with pytest.raises(UserInputError, match=f"{tmp_path / 'x.tar.gz'}: no such archive"):
        unpack_folder(tmp_path / "x.tar.gz", tmp_path / "out")
    archive = pack_folder(_folder(tmp_path / "run"), tmp_path / "run.tar.gz")
    there = tmp_path / "there"
    there.mkdir()
    (there / "mine").write_text("kept", encoding="utf-8")
    with pytest.raises(UserInputError, match="already exists; not unpacking"):
        unpack_folder(archive, there)
    assert _files(there) == {"mine": b"kept"}


@pytest.fixture
def disk(tmp_path: Path):
    """A 4 MiB tmpfs, unmounted afterwards."""
    with mounted_tmpfs(tmp_path / "disk", 4 << 20) as mount:
        yield mount


def test_a_full_disk_keeps_the_old_archive_and_leaves_no_folder(tmp_path: Path, disk) -> None:
    """Packing a 1 MiB folder onto a disk with 64 KiB free: one line naming the archive, the
    previous archive byte-identical, no temp file. Unpacking it onto the full disk: one line
    naming the folder, no folder and no temp folder left."""
    src = tmp_path / "big"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(1 << 20))  # random: gzip cannot shrink it
    old = disk / "run.tar.gz"
    pack_folder(_folder(tmp_path / "small"), old)
    before = old.read_bytes()
    leave_free(disk, 64 << 10)
    with pytest.raises(WriteFailedError, match=f"{old}.*no space left on device") as err:
        pack_folder(src, old)
    assert "\n" not in str(err.value)
    assert old.read_bytes() == before
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "run.tar.gz"]

    archive = pack_folder(src, tmp_path / "big.tar.gz")
    target = disk / "unpacked"
    with pytest.raises(WriteFailedError, match=f"{target}.*no space left on device.*intact"):
        unpack_folder(archive, target)
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "run.tar.gz"]
