"""A byte-level BPE tokenizer read from a Hugging Face ``tokenizer.json``, in pure Python.

The server must serve the bundled ``tiny_llm`` after a bare ``pip install -e .``, so the
model cannot need Hugging Face's ``tokenizers`` (and the ``huggingface_hub`` it pulls in) at
run time. This reads the subset ``scripts/make_llm.py`` writes, the one GPT-2-family models
use: no normalizer, a ``Split`` on a regular expression (``Isolated``) then ``ByteLevel``
without its own regex (Llama 3's shape, with a pattern Python's ``re`` reads the same way), a
BPE model with merges, added tokens matched before anything else. The tests check it id for id
against ``tokenizers`` (tests/unit/test_llm_tokenizer.py). Anything else is refused at load
with one line saying what was found.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


class TokenizerError(ValueError):
    """A tokenizer.json this reader does not support, or a malformed one."""


class ByteBPETokenizer:
    """``encode(text) -> ids``; ``token_bytes(id)`` for streaming detokenization."""

    def __init__(self, spec: dict[str, Any]) -> None:
        model = spec.get("model") or {}
        if model.get("type") != "BPE":
            raise TokenizerError(f"only BPE tokenizers are supported, not {model.get('type')!r}")
        if spec.get("normalizer") is not None:
            raise TokenizerError("tokenizers with a normalizer are not supported")
        for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                raise TokenizerError(f"BPE with {key} is not supported")
        if model.get("byte_fallback"):
            raise TokenizerError("BPE with byte_fallback is not supported")
        self.vocab: dict[str, int] = dict(model["vocab"])
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(model.get("merges") or []):
            a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
            self.ranks[(a, b)] = rank
        self._pattern = re.compile(self._pre_tokenizer_pattern(spec.get("pre_tokenizer")))
        self.added: dict[str, int] = {}
        self.special_ids: set[int] = set()
        for token in spec.get("added_tokens") or []:
            self.added[token["content"]] = token["id"]
            if token.get("special"):
                self.special_ids.add(token["id"])
        self._added_pattern = (re.compile("|".join(
            re.escape(t) for t in sorted(self.added, key=len, reverse=True)))
            if self.added else None)
        self._byte_map = byte_to_unicode()
        self._unbyte = {c: b for b, c in self._byte_map.items()}
        self.id_to_token: dict[int, str] = {i: t for t, i in self.vocab.items()}
        self.id_to_token.update({i: t for t, i in self.added.items()})
        self.vocab_size = max(self.id_to_token) + 1
        self._bytes: dict[int, bytes] = {}
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_file(cls, path: str | Path) -> ByteBPETokenizer:
        try:
            spec = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TokenizerError(f"cannot read {path}: {exc}") from exc
        try:
            return cls(spec)
        except (KeyError, TypeError, re.error) as exc:
            raise TokenizerError(f"{path}: malformed tokenizer.json: {exc!r}") from exc

    @staticmethod
    def _pre_tokenizer_pattern(pre: Any) -> str:
        if pre is None:
            raise TokenizerError("a byte-level BPE tokenizer needs a ByteLevel pre-tokenizer")
        steps = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
        kinds = [s.get("type") for s in steps]
        if (kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True)
                and not steps[1].get("add_prefix_space")
                and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert")
                and "Regex" in steps[0].get("pattern", {})):
            return str(steps[0]["pattern"]["Regex"])
        raise TokenizerError(f"unsupported pre-tokenizer {kinds}: this reader takes Split "
                             "(Isolated) then ByteLevel (no regex, no add_prefix_space)")

    # -- encoding ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        start = 0
        if self._added_pattern is not None:
            for match in self._added_pattern.finditer(text):
                self._encode_plain(text[start:match.start()], ids)
                ids.append(self.added[match.group()])
                start = match.end()
        self._encode_plain(text[start:], ids)
        return ids

    def _encode_plain(self, text: str, out: list[int]) -> None:
        pos = 0
        for match in self._pattern.finditer(text):
            if match.start() > pos:  # Isolated: the text between matches is a piece too
                out.extend(self._piece(text[pos:match.start()]))
            if match.end() > match.start():
                out.extend(self._piece(match.group()))
            pos = match.end()
        if pos < len(text):
            out.extend(self._piece(text[pos:]))

    def _piece(self, piece: str) -> tuple[int, ...]:
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        word = [self._byte_map[b] for b in piece.encode("utf-8")]
        ranks = self.ranks
        while len(word) > 1:
            best = min(((ranks[pair], i) for i, pair in
                        enumerate(zip(word, word[1:], strict=False)) if pair in ranks),
                       default=None)
            if best is None:
                break
            a, b = word[best[1]], word[best[1] + 1]
            merged: list[str] = []
            i = 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == a and word[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        ids = tuple(self.vocab[s] for s in word)
        if len(self._cache) < 50_000:
            self._cache[piece] = ids
        return ids

    # -- decoding ---------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one id stands for (b"" for a special token or an unknown id)."""
        found = self._bytes.get(token_id)
        if found is None:
            token = self.id_to_token.get(token_id)
            if token is None or token_id in self.special_ids:
                found = b""
            elif token in self.added:
                found = token.encode("utf-8")
            else:
                found = bytes(self._unbyte[c] for c in token)
            self._bytes[token_id] = found
        return found

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")


def utf8_complete(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a character boundary: a streamed token may
    stop inside a multi-byte character, whose bytes wait for the next token."""
    n = len(data)
    for back in range(1, min(3, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for its lead
        need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else \
            4 if byte >> 3 == 0b11110 else 1
        return n - back if back < need else n
    return n
