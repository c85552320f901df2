"""A character n-gram text generator with numpy: the sampling half of the ``textgen``
example model (``build_model.py`` next to ``model_repository`` counts the n-grams).

The model predicts the next character from the ``order`` characters before it, mixing
the counts of every context length from ``order`` down to 0 with Witten-Bell
interpolation:

    P_k(c | h_k) = (N(h_k, c) + T(h_k) * P_{k-1}(c | h_{k-1})) / (N(h_k) + T(h_k))

where ``h_k`` is the last ``k`` characters, ``N(h_k, c)`` how often ``c`` followed
``h_k`` in the training text, ``N(h_k)`` their sum and ``T(h_k)`` how many different
characters followed ``h_k``; ``P_0`` is the characters' frequency. A context never seen
leaves the lower order's distribution as it is.

The saved model (``np.savez_compressed``, every array below by name):

* ``vocab``: unicode ``[V]``, one character each (``V`` <= 96; printable ASCII).
* ``order``: int64 ``[]``, the longest context in characters.
* ``unigram``: int64 ``[V]``, count of each character.
* for ``k`` in ``1 .. order``, a sparse ``[contexts, V]`` count table:
  ``contexts_k`` int64 ``[C_k]`` (sorted context codes, see :func:`context_code`),
  ``indptr_k`` int64 ``[C_k + 1]``, ``next_k`` int64 ``[E_k]`` (character indices of
  each context's successors, rows ``indptr_k[i] : indptr_k[i + 1]``) and ``counts_k``
  int64 ``[E_k]``.

Sampling is deterministic for a given model file, prompt, temperature and seed: the
same numpy code runs in the server and in the example's client, so a client can check
the streamed text exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

#: stand-ins for the typographic characters of the training text (everything kept is
#: printable ASCII, so one character is one byte of UTF-8)
ASCII_FOR = {
    "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-",
    "\u2014": "-", "\u2026": "...", "\u00b0": " degrees", "\u00df": "ss",
}  # fmt: skip


def normalize(text: str) -> str:
    """``text`` as the model sees it: typographic characters as ASCII, other characters
    outside printable ASCII dropped, every run of whitespace one space (kept at either
    end: a prompt ending in a space asks for a new word)."""
    for char, ascii_text in ASCII_FOR.items():
        text = text.replace(char, ascii_text)
    kept = "".join(c if " " <= c <= "~" else " " if c.isspace() else "" for c in text)
    return re.sub(" {2,}", " ", kept)


def context_code(indices: np.ndarray, vocab_size: int) -> int:
    """The integer code of a context: character indices ``[k]`` (oldest first) as digits
    in base ``vocab_size``, the most recent character the least significant. Codes of
    contexts up to 8 characters fit int64 for ``vocab_size`` <= 96."""
    code = 0
    for index in indices.tolist():
        code = code * vocab_size + int(index)
    return code


class CharNgram:
    """A trained character n-gram model (see the module docstring for the arrays)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.vocab: list[str] = [str(c) for c in arrays["vocab"].tolist()]
        self.order = int(arrays["order"])
        self._index = {c: i for i, c in enumerate(self.vocab)}
        unigram = arrays["unigram"].astype(np.float64)
        self._unigram = unigram / unigram.sum()
        self._tables = [
            (arrays[f"contexts_{k}"], arrays[f"indptr_{k}"], arrays[f"next_{k}"],
             arrays[f"counts_{k}"].astype(np.float64))
            for k in range(1, self.order + 1)
        ]  # fmt: skip

    @classmethod
    def load(cls, path: str | Path) -> CharNgram:
        """The model saved at ``path`` (an ``.npz`` file)."""
        with np.load(path) as data:
            return cls({name: data[name] for name in data.files})

    def encode(self, text: str) -> np.ndarray:
        """Character indices int64 ``[len(text)]`` of ``text`` (already normalized); -1
        for a character outside the vocabulary."""
        return np.array([self._index.get(c, -1) for c in text], dtype=np.int64)

    def distribution(self, history: np.ndarray) -> np.ndarray:
        """P(next character | the last ``order`` indices of ``history``): float64 ``[V]``
        summing to 1. ``history``: int64 ``[n]`` character indices, -1 for unknown ones
        (no context through an unknown character is looked up)."""
        probs = self._unigram
        size = len(self.vocab)
        tail = history[-self.order :] if self.order else history[:0]
        known = 0
        while known < len(tail) and tail[len(tail) - 1 - known] >= 0:
            known += 1
        for k in range(1, known + 1):
            contexts, indptr, nxt, counts = self._tables[k - 1]
            code = context_code(tail[len(tail) - k :], size)
            row = int(np.searchsorted(contexts, code))
            if row == len(contexts) or contexts[row] != code:
                break  # a longer context containing this one was never seen either
            lo, hi = int(indptr[row]), int(indptr[row + 1])
            seen = np.zeros(size)
            seen[nxt[lo:hi]] = counts[lo:hi]
            total, types = counts[lo:hi].sum(), hi - lo
            probs = (seen + types * probs) / (total + types)
        return probs

    def generate(
        self, prompt: str, max_tokens: int, temperature: float = 0.8, seed: int | None = 0
    ) -> Iterator[str]:
        """Sample up to ``max_tokens`` characters following ``prompt``, one at a time.

        Args:
            prompt: the text to continue (normalized here).
            max_tokens: characters to generate.
            temperature: > 0 sharpens (< 1) or flattens (> 1) the distribution; 0 or less
                takes the most likely character every time. Rounded to float32 first,
                as the model's FP32 input carries it.
            seed: seed of numpy's ``default_rng`` (None: fresh entropy).
        """
        temperature = float(np.float32(temperature))
        rng = np.random.default_rng(seed)
        history = self.encode(normalize(prompt))
        for _ in range(max_tokens):
            probs = self.distribution(history)
            if temperature <= 0:
                index = int(np.argmax(probs))
            else:
                weights = probs ** (1.0 / temperature)
                cumulative = np.cumsum(weights)
                draw = rng.random() * cumulative[-1]
                index = min(int(np.searchsorted(cumulative, draw, side="right")), len(probs) - 1)
            history = np.append(history[-self.order :], index) if self.order else history
            yield self.vocab[index]
