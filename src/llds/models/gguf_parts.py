"""A model file in parts small enough to travel one at a time, joined back and checked.

A machine that takes a bounded copy of files per call cannot take a 98 MB GGUF at once. Its
bytes are cut into parts with a manifest of SHA-256 digests; joining checks every part and the
whole, so the joined file is the original byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from llds.io import atomic_write

MANIFEST = "manifest.json"
CHUNK = 1 << 20


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def split_file(path: str | Path, parts_dir: str | Path, max_bytes: int) -> dict[str, Any]:
    """Cut `path` into `part-00`, `part-01`, ... of at most `max_bytes` each in `parts_dir`,
    each in a folder of its own (`parts_dir/00/part-00`, so that each can be carried alone),
    with `parts_dir/manifest.json`; returns the manifest."""
    src, out = Path(path), Path(parts_dir)
    if max_bytes < 1:
        raise ValueError("max_bytes: at least 1")
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(src, "rb") as f:
        index = 0
        while block := f.read(max_bytes):
            name = f"part-{index:02d}"
            target = out / f"{index:02d}" / name
            target.parent.mkdir(exist_ok=True)
            target.write_bytes(block)
            parts.append(
                {"file": f"{index:02d}/{name}", "bytes": len(block), "sha256": _sha256(target)}
            )
            index += 1
    manifest = {
        "name": src.name,
        "bytes": src.stat().st_size,
        "sha256": _sha256(src),
        "parts": parts,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def join_parts(parts_dir: str | Path, out_file: str | Path) -> Path:
    """Join the parts listed in `parts_dir/manifest.json` into `out_file` (written beside it and
    renamed, so a failed join leaves nothing half-written), checking each part's digest and the
    whole's as it goes (every part is read once);
    raises `ValueError` naming the first missing or damaged part."""
    where, out = Path(parts_dir), Path(out_file)
    manifest_path = where / MANIFEST
    if not manifest_path.is_file():
        raise ValueError(f"{manifest_path}: no manifest (made by `weights.py split`)")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    for part in manifest["parts"]:
        p = where / part["file"]
        if not p.is_file():
            raise ValueError(f"{p}: missing (a part that has not arrived yet?)")
    whole = hashlib.sha256()
    with atomic_write(out, "wb") as f:  # an error below leaves `out` as it was
        for part in manifest["parts"]:
            p = where / part["file"]
            data = p.read_bytes()
            if len(data) != part["bytes"] or hashlib.sha256(data).hexdigest() != part["sha256"]:
                raise ValueError(f"{p}: damaged (its size or SHA-256 differs from {manifest_path})")
            whole.update(data)
            f.write(data)
        if whole.hexdigest() != manifest["sha256"]:
            raise ValueError(f"{out}: the joined file's SHA-256 differs from {manifest_path}")
    return out
