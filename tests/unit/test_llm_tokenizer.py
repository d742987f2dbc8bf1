"""nursery/llm's byte-level BPE reader against Hugging Face's ``tokenizers`` on the bundled
tiny_llm tokenizer: the same ids for any text (special tokens included), and decoding gives
the text back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from nursery.llm.tokenizer import ByteBPETokenizer, TokenizerError, utf8_complete

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "model_repository" / "tiny_llm" / "tokenizer" / "tokenizer.json"
OURS = ByteBPETokenizer.from_file(TOKENIZER)
THEIRS = Tokenizer.from_file(str(TOKENIZER))
SPECIAL = ["<|bos|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]

pieces = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20),
    st.text(alphabet=" \t\n\rabcXYZ019.,'!_-é😀", max_size=20),
    st.sampled_from(SPECIAL + ["the model", "  repository\n\n", "Triton's", "<|user", "|>"]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(pieces, max_size=8).map("".join))
def test_same_ids_as_hugging_face_tokenizers(text: str) -> None:
    ids = OURS.encode(text)
    assert ids == THEIRS.encode(text, add_special_tokens=False).ids
    assert OURS.decode(ids) == THEIRS.decode(ids, skip_special_tokens=True)


def test_the_docs_round_trip() -> None:
    text = (ROOT / "README.md").read_text()
    ids = OURS.encode(text)
    assert ids == THEIRS.encode(text).ids
    assert OURS.decode(ids) == text
    assert b"".join(OURS.token_bytes(i) for i in ids) == text.encode()


def test_special_tokens_are_single_ids_and_decode_to_nothing() -> None:
    ids = OURS.encode("<|bos|><|user|>\nhi<|end|>")
    assert ids[:2] == [0, 3] and ids[-1] == 1
    assert OURS.decode(ids) == "\nhi"


def test_utf8_complete_holds_back_a_partial_character() -> None:
    smile = "😀".encode()
    for cut in range(len(smile)):
        assert utf8_complete(b"ab" + smile[:cut]) == 2 + (len(smile) if cut == 4 else 0)
    assert utf8_complete(b"ab" + smile) == 6
    assert utf8_complete(b"\x80\x80\x80\x80") == 4  # garbage is not held for ever


def test_unsupported_tokenizers_are_refused_with_the_reason(tmp_path: Path) -> None:
    spec = json.loads(TOKENIZER.read_text())
    spec["pre_tokenizer"] = {"type": "Whitespace"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(TokenizerError, match="unsupported pre-tokenizer"):
        ByteBPETokenizer.from_file(tmp_path / "tokenizer.json")
    spec["model"]["type"] = "WordPiece"
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(TokenizerError, match="only BPE"):
        ByteBPETokenizer.from_file(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer.json").write_text("{")
    with pytest.raises(TokenizerError, match="cannot read"):
        ByteBPETokenizer.from_file(tmp_path / "tokenizer.json")
