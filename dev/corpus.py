"""The character corpus the demo and the tests train on, built where it is
missing: tiny Shakespeare from ../shared when this machine has it, else text
every machine with Python has. Nothing is downloaded, and nothing is copied
into the project. No dependencies: the demo and the tests both load it."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_CORPUS = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
# About tiny Shakespeare's size (1,115,394 characters).
CORPUS_BYTES = 1_100_000


def write_corpus(dest: Path, shared: Path = SHARED_CORPUS) -> str:
    """Shakespeare from ../shared when this machine has it; otherwise a corpus of
    the same size built from text every machine with Python has: the standard
    library's own sources. Nothing is downloaded or copied into the project."""
    if shared.exists():
        dest.write_bytes(shared.read_bytes())
        return f"tinyshakespeare ({shared})"
    stdlib = Path(os.__file__).parent
    chunks, size = [], 0
    for source in sorted(stdlib.glob("*.py")):
        text = source.read_text(encoding="utf-8", errors="ignore")
        text = "".join(ch for ch in text if ch.isascii())
        chunks.append(text)
        size += len(text)
        if size >= CORPUS_BYTES:
            break
    dest.write_text("".join(chunks)[:CORPUS_BYTES])
    return f"Python standard library sources ({stdlib})"
