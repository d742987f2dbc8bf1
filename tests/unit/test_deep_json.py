"""``deep_json``: JSON bodies however deeply nested, parsed without recursion, with the
standard library's grammar and messages, and the fast parser kept to shallow bodies."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.protocol.codecs import deep_json
from nursery.protocol.codecs.deep_json import KEEP_DEPTH, TOO_DEEP, JSONSyntaxError

_scalars = (st.none() | st.booleans() | st.integers() | st.text()
            | st.floats(allow_nan=False, allow_infinity=False))
documents = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(max_size=5), inner, max_size=4), max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(doc=documents, indent=st.sampled_from([None, 0, 2]))
def test_the_iterative_parser_reads_what_the_standard_library_reads(doc: object,
                                                                   indent: int | None) -> None:
    text = json.dumps(doc, indent=indent)
    assert deep_json.loads_iterative(text) == json.loads(text)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet='[]{},:"0123456789.-eEtrufalsnNI \\', max_size=24))
def test_broken_documents_get_the_standard_librarys_words(text: str) -> None:
    want: object
    try:
        want = json.loads(text)
    except ValueError as exc:
        want = exc
    if isinstance(want, ValueError):
        with pytest.raises(JSONSyntaxError) as got:
            deep_json.loads_iterative(text)
        # the same complaint; where a run of closing brackets fails, at the run's start
        assert str(got.value).split(":")[0] == str(want).split(":")[0]
        return
    got_value = deep_json.loads_iterative(text)
    assert got_value == want or (isinstance(want, float) and math.isnan(want))


def test_nan_infinity_and_duplicate_keys_as_the_standard_library() -> None:
    got = deep_json.loads_iterative('{"a": [NaN, Infinity, -Infinity, -0.5e1], "a": 1, "b": 2}')
    assert got == {"a": 1, "b": 2}
    values = deep_json.loads_iterative("[NaN, Infinity, -Infinity, -0.5e1]")
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf, -5.0]


@pytest.mark.parametrize("depth", [KEEP_DEPTH + 1, 250_000])
def test_any_depth_parses_and_the_deepest_containers_are_not_kept(depth: int) -> None:
    body = '{"ready":' + "[" * depth + "true" + "]" * depth + ', "after": {"x": [1]}}'
    doc = deep_json.loads(body.encode())
    assert doc["after"] == {"x": [1]}
    node, kept = doc["ready"], 1  # the object is the first level kept
    while isinstance(node, list):
        assert len(node) == 1
        node, kept = node[0], kept + 1
    assert node is TOO_DEEP and kept == KEEP_DEPTH  # the container below the last kept level
    assert repr(TOO_DEEP) == "<JSON nested too deeply>"


def test_deep_objects_and_mixed_brackets() -> None:
    depth = 100_000
    body = '[{"k":' * depth + "1" + "}]" * depth
    doc = deep_json.loads(body.encode())
    assert isinstance(doc, list) and isinstance(doc[0], dict)
    for broken in ('[{"k":' * depth + "1" + "]}" * depth,  # closers swapped
                   "[" * depth + "]" * (depth - 1),  # one short
                   "[" * depth + "]" * (depth + 1)):  # one too many
        with pytest.raises(JSONSyntaxError):
            deep_json.loads(broken.encode())


def test_the_fast_parser_only_sees_shallow_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    """orjson recurses on the C stack: a deep body must never reach it."""
    seen: list[bytes] = []
    monkeypatch.setattr(deep_json, "_fast", lambda data: seen.append(data) or json.loads(data))
    flat = json.dumps({"data": list(range(10_000))}).encode()
    nested = json.dumps([[i] for i in range(10_000)]).encode()  # many brackets, depth 2
    assert deep_json.shallow(flat) and deep_json.shallow(nested)
    deep_json.loads(flat)
    deep_json.loads(memoryview(nested))
    assert len(seen) == 2
    deep = b"[" * 600 + b"]" * 600
    assert not deep_json.shallow(deep)
    assert deep_json.max_depth_bound(deep) == 600
    deep_json.loads(deep)
    # brackets inside strings count toward the bound: parsed the slow way, read the same
    text = json.dumps({"text": "[" * 10_000}).encode()
    assert not deep_json.shallow(text)
    assert deep_json.loads(text) == {"text": "[" * 10_000}
    assert len(seen) == 2  # neither went to the fast parser
