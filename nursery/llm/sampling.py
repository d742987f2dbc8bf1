"""Choosing the next token of one sequence from its logits, and the text it streams.

Sampling is per sequence with its own random generator: a request with a ``seed`` draws the
same tokens whether it runs alone or in a batch. ``temperature`` 0 (or ``top_k`` 1) is
greedy; otherwise logits / temperature, the ``top_k`` best, then the smallest set whose
probability reaches ``top_p``, as vLLM and TRT-LLM order them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from nursery.llm.tokenizer import utf8_complete


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def problem(self) -> str | None:
        """Why these values cannot be used (None when they can)."""
        if not np.isfinite(self.temperature) or self.temperature < 0:
            return f"temperature must be a number >= 0, got {self.temperature}"
        if not (np.isfinite(self.top_p) and 0 < self.top_p <= 1):
            return f"top_p must be in (0, 1], got {self.top_p}"
        if self.top_k < 0:
            return f"top_k must be >= 0, got {self.top_k}"
        return None


class Sampler:
    def __init__(self, params: SamplingParams, rng: np.random.Generator,
                 bad_words: Sequence[Sequence[int]] = ()) -> None:
        self.params = params
        self.rng = rng
        self.bad_words = [tuple(w) for w in bad_words if w]
        self.greedy = params.temperature == 0 or params.top_k == 1

    def next_token(self, logits: np.ndarray, generated: Sequence[int]) -> int:
        if self.bad_words:
            logits = logits.copy()
            for word in self.bad_words:
                head = word[:-1]
                if not head or tuple(generated[-len(head):]) == head:
                    logits[word[-1]] = -np.inf
        if self.greedy:
            return int(np.argmax(logits))
        p = self.params
        z = logits.astype(np.float64) / p.temperature
        if 0 < p.top_k < z.shape[0]:
            kth = np.partition(z, -p.top_k)[-p.top_k]
            z[z < kth] = -np.inf
        z -= z.max()
        probs = np.exp(z)
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            ranked = probs[order]
            before = np.cumsum(ranked) - ranked  # probability of the tokens ranked above
            probs[order[before >= p.top_p]] = 0.0
            probs /= probs.sum()
        cumulative = np.cumsum(probs)
        return int(min(np.searchsorted(cumulative, self.rng.random() * cumulative[-1],
                                       side="right"), probs.shape[0] - 1))


class TextStream:
    """The text of a sequence's generated tokens, released as it becomes certain: bytes of a
    character not yet complete wait, and so does a tail that may be the start of a stop
    string. ``push`` returns the new text and whether a stop string ended the sequence (the
    stop string itself is not part of the text, as in OpenAI's API)."""

    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        self.stop = [s for s in stop if s]
        self._raw = b""
        self.text = ""  # decoded so far (complete characters)
        self.sent = 0  # characters of text already released

    def push(self, token: int) -> tuple[str, bool]:
        self._raw += self._token_bytes(token)
        complete = utf8_complete(self._raw)
        if complete:
            self.text += self._raw[:complete].decode("utf-8", errors="replace")
            self._raw = self._raw[complete:]
        if self.stop:
            window = max(0, self.sent - max(map(len, self.stop)))
            hits = [i for i in (self.text.find(s, window) for s in self.stop) if i >= 0]
            if hits:
                end = min(hits)
                self.text = self.text[:end]
                self._raw = b""  # bytes after the stop string are not part of the text
                return self._release(end), True
            return self._release(len(self.text) - self._held()), False
        return self._release(len(self.text)), False

    def finish(self) -> str:
        """What is left at the end (held bytes decoded with replacement characters)."""
        if self._raw:
            self.text += self._raw.decode("utf-8", errors="replace")
            self._raw = b""
        return self._release(len(self.text))

    def _held(self) -> int:
        """The longest tail of the text that begins some stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _release(self, upto: int) -> str:
        upto = max(upto, self.sent)
        out = self.text[self.sent:upto]
        self.sent = upto
        return out
