"""The SmolLM2 GGUF in parts small enough to travel one at a time, and joined back, checked.

A machine that takes a bounded copy of the working tree per call (the GPU version of this
study, `gpu.py`) cannot take the 98 MB file at once. Its bytes are cut into parts of at most
`--max-mib` with a manifest of SHA-256 digests; joining checks every part and the whole, so the
joined file is the packaged one byte for byte and the model it loads has the same logits.

    python experiments/smollm2_wiki/weights.py split GGUF PARTS_DIR [--max-mib 36]
    python experiments/smollm2_wiki/weights.py join PARTS_DIR OUT_FILE
    python experiments/smollm2_wiki/weights.py verify PARTS_DIR   # logits against the package's
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any

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
    renamed, so a failed join leaves nothing half-written), after checking each part's digest;
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
        if p.stat().st_size != part["bytes"] or _sha256(p) != part["sha256"]:
            raise ValueError(f"{p}: damaged (its size or SHA-256 differs from {manifest_path})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    with open(tmp, "wb") as f:
        for part in manifest["parts"]:
            f.write((where / part["file"]).read_bytes())
    if _sha256(tmp) != manifest["sha256"]:
        tmp.unlink()
        raise ValueError(f"{out}: the joined file's SHA-256 differs from {manifest_path}")
    os.replace(tmp, out)
    return out


def verify(parts_dir: str | Path, work: str | Path) -> float:
    """Join the parts in `work`, load the joined GGUF and the installed package's, and return
    the largest absolute difference of their logits on one sentence (0.0 when the same)."""
    import torch

    from llds.models.smollm2 import _dequantized, gguf_file

    joined = join_parts(parts_dir, Path(work) / "joined.gguf")
    text = "The capital of France is Paris, and the symbol of gold is"
    logits = []
    for path in (joined, gguf_file()):
        model, tok = _dequantized(path)
        with torch.no_grad():
            logits.append(model(**tok(text, return_tensors="pt")).logits)
    return float((logits[0] - logits[1]).abs().max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split", help="cut a file into checked parts")
    s.add_argument("file", type=Path)
    s.add_argument("parts_dir", type=Path)
    s.add_argument("--max-mib", type=float, default=36.0)
    j = sub.add_parser("join", help="join checked parts into a file")
    j.add_argument("parts_dir", type=Path)
    j.add_argument("out_file", type=Path)
    v = sub.add_parser("verify", help="join, then compare logits with the package's GGUF")
    v.add_argument("parts_dir", type=Path)
    v.add_argument("--work", type=Path, default=Path("/tmp/llds-weights-check"))
    args = ap.parse_args()
    if args.cmd == "verify":
        print(f"largest logit difference: {verify(args.parts_dir, args.work)}")
    elif args.cmd == "split":
        m = split_file(args.file, args.parts_dir, int(args.max_mib * (1 << 20)))
        sizes = ", ".join(f"{p['file']} {p['bytes'] / 1e6:.1f} MB" for p in m["parts"])
        print(f"{m['name']} ({m['bytes'] / 1e6:.1f} MB, sha256 {m['sha256'][:12]}): {sizes}")
    else:
        try:
            print(join_parts(args.parts_dir, args.out_file))
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
