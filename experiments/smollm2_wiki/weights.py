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
from pathlib import Path

from llds.models.gguf_parts import join_parts, split_file


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
