"""Character tokenizer built from the training transcripts, saved in WeNet's ``units.txt`` form."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from ..errors import UsageError

BLANK = "<blank>"
SPACE = "▁"  # how units.txt writes a space, as WeNet does


class CharTokenizer:
    """Characters to ids; id 0 is the CTC blank. Unknown characters are refused, not mapped."""

    def __init__(self, chars: Iterable[str]):
        self.units = [BLANK] + sorted(set(chars) - {BLANK})
        self.index = {u: i for i, u in enumerate(self.units)}

    @classmethod
    def build(cls, texts: Iterable[str]) -> "CharTokenizer":
        chars: set[str] = set()
        for t in texts:
            chars.update(t)
        return cls(chars)

    def __len__(self) -> int:
        return len(self.units)

    def oov(self, text: str) -> set[str]:
        """Characters of ``text`` the tokenizer does not know."""
        return {c for c in text if c not in self.index}

    def encode(self, text: str) -> list[int]:
        return [self.index[c] for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.units[i] for i in ids if i != 0)

    def save(self, path: str | Path) -> None:
        lines = [f"{u if u != ' ' else SPACE} {i}" for i, u in enumerate(self.units)]
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "CharTokenizer":
        units = []
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            unit, _ = line.rsplit(" ", 1)
            units.append(" " if unit == SPACE else unit)
        tok = cls(units)
        if tok.units != units:
            raise UsageError(f"{path}: units are not in canonical order (blank first, then sorted)")
        return tok
