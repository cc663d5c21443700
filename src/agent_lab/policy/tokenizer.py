"""Word-level tokenizer over an environment's text protocol (book/part2/00_nested_policies.md).

Environments speak plain text: words separated by single spaces, lines by ``\\n``. The tokenizer maps
each word of ``env.vocabulary()`` to one id and the line break to the special token ``<nl>``, so an
action ``guess 8`` followed by its newline is the token sequence ``[guess, 8, <nl>]``. Four special
tokens come first: ``<pad>`` (padding, never attended to), ``<bos>`` (starts every transcript),
``<unk>`` (any word outside the vocabulary) and ``<nl>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

PAD, BOS, UNK, NL = "<pad>", "<bos>", "<unk>", "<nl>"
SPECIALS = (PAD, BOS, UNK, NL)


class WordTokenizer:
    """Bijective map between words (plus ``<nl>``) and integer ids.

    ``encode("guess 8\\nhigher")`` -> ids of ``[guess, 8, <nl>, higher]``; ``decode`` inverts it for
    in-vocabulary text. Special tokens have ids 0..3: ``pad_id=0, bos_id=1, unk_id=2, nl_id=3``.
    """

    def __init__(self, words: Iterable[str]):
        vocab = list(SPECIALS)
        seen = set(vocab)
        for w in words:
            if not isinstance(w, str) or not w or " " in w or "\n" in w:
                raise ValueError(f"words must be non-empty strings without spaces or newlines, got {w!r}")
            if w not in seen:
                seen.add(w)
                vocab.append(w)
        self.vocab: list[str] = vocab
        self.index: dict[str, int] = {w: i for i, w in enumerate(vocab)}
        self.pad_id, self.bos_id, self.unk_id, self.nl_id = (self.index[s] for s in SPECIALS)

    @classmethod
    def from_env(cls, env) -> WordTokenizer:
        """Build the tokenizer from ``env.vocabulary()`` (the environment's complete word list)."""
        return cls(env.vocabulary())

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids the policy may never sample: padding, begin-of-sequence and unknown."""
        return (self.pad_id, self.bos_id, self.unk_id)

    def encode(self, text: str) -> list[int]:
        """Text -> ids: words by single spaces, ``\\n`` -> ``<nl>``; unknown words -> ``<unk>``."""
        ids: list[int] = []
        lines = text.split("\n")
        for k, line in enumerate(lines):
            if k > 0:
                ids.append(self.nl_id)
            for w in line.split():
                ids.append(self.index.get(w, self.unk_id))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text: ``<nl>`` becomes a line break, ``<pad>``/``<bos>`` are dropped, words join by spaces."""
        out: list[str] = []
        line: list[str] = []
        for i in ids:
            i = int(i)
            if i == self.nl_id:
                out.append(" ".join(line))
                line = []
            elif i in (self.pad_id, self.bos_id):
                continue
            else:
                line.append(self.vocab[i])
        out.append(" ".join(line))
        return "\n".join(out)

    def state_dict(self) -> dict:
        """What a checkpoint stores to rebuild the exact same id map."""
        return {"vocab": list(self.vocab)}

    @classmethod
    def from_state_dict(cls, state: dict) -> WordTokenizer:
        vocab = state["vocab"]
        if tuple(vocab[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"state['vocab'] must start with {SPECIALS}, got {vocab[:4]}")
        return cls(vocab[len(SPECIALS):])
