"""``--openai-restricted-api``'s parsing and matching (nursery/protocol/openai/restrictions.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nursery.protocol.openai.restrictions import ENDPOINTS, RestrictionError, parse


def test_groups_headers_and_summary() -> None:
    r = parse([("inference,model-repository", "Admin-Key", "v1"), ("metrics", "m", "v2")])
    assert r.summary() == {"inference": "Admin-Key", "model-repository": "Admin-Key",
                           "metrics": "m"}
    assert r.required("POST", "/v1/chat/completions") == ("Admin-Key", "v1")
    assert r.required("GET", "/v1/models/x") == ("Admin-Key", "v1")
    assert r.required("HEAD", "/v1/models") == ("Admin-Key", "v1")
    assert r.required("POST", "/v1/models/x/load") == ("Admin-Key", "v1")
    assert r.required("GET", "/metrics") == ("m", "v2")
    assert r.required("GET", "/health/ready") is None
    assert r.required("GET", "/health", route_group="health") is None  # not restricted
    assert r.required("GET", "/elsewhere", route_group="inference") == ("Admin-Key", "v1")
    assert not parse([])


def test_values_compare_exactly() -> None:
    need = ("k", "sécret")
    r = parse([("health", *need)])
    assert r.allows(need, "sécret".encode())
    assert not r.allows(need, b"secret") and not r.allows(need, None)
    assert r.message(need) == "This API is restricted, expecting header 'k' with valid value"


@pytest.mark.parametrize(("groups", "message"), [
    ([("nope", "k", "v")], "Unknown API 'nope'. Available APIs: ['inference', "
                           "'model-repository', 'metrics', 'health']"),
    ([("inference,", "k", "v")], "Unknown API ''"),
    ([("health,health", "k", "v")],
     "restricted api 'health' can not be specified in multiple config groups"),
    ([("health", "k", "v"), ("metrics,health", "k", "v")],
     "restricted api 'health' can not be specified in multiple config groups"),
])
def test_refusals_in_tritons_words(groups: list[tuple[str, str, str]], message: str) -> None:
    with pytest.raises(RestrictionError) as caught:
        parse(groups)
    assert str(caught.value).startswith(message)


@given(st.sets(st.sampled_from(sorted(ENDPOINTS)), min_size=1), st.text(max_size=20))
def test_every_route_of_a_restricted_group_needs_the_header(apis: set[str], tail: str) -> None:
    r = parse([(",".join(sorted(apis)), "k", "v")])
    for api in apis:
        for method, prefix in ENDPOINTS[api]:
            assert r.required(method, prefix + tail) == ("k", "v")
    for api in set(ENDPOINTS) - apis:
        assert r.required("GET", "/", route_group=api) is None
