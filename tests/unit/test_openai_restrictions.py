"""``--openai-restricted-api``'s parsing and matching (nursery/protocol/openai/restrictions.py;
the check itself is the KServe ports', ``protocol/access.py``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nursery.protocol.openai.restrictions import (
    ENDPOINTS,
    ROUTES,
    RestrictionError,
    group_of,
    message,
    parse,
    summary,
)


def test_groups_headers_and_summary() -> None:
    r = parse([("inference,model-repository", "Admin-Key", "v1"), ("metrics", "m", "v2")])
    assert summary(r) == {"inference": "Admin-Key", "model-repository": "Admin-Key",
                          "metrics": "m"}

    def required(method: str, path: str) -> tuple[str, str] | None:
        group = group_of(method, path)
        return None if group is None else r.rule(group)

    assert required("POST", "/v1/chat/completions") == ("Admin-Key", "v1")
    assert required("GET", "/v1/models/x") == ("Admin-Key", "v1")
    assert required("HEAD", "/v1/models") == ("Admin-Key", "v1")
    assert required("POST", "/v1/models/x/load") == ("Admin-Key", "v1")
    assert required("GET", "/metrics") == ("m", "v2")
    assert required("GET", "/health/ready") is None
    assert required("GET", "/health") is None  # nursery's alias: health, not restricted
    assert required("POST", "/v1/completions/") == ("Admin-Key", "v1")  # by its route
    assert required("POST", "/v1/chat/completionsX") == ("Admin-Key", "v1")  # Triton's prefix
    assert required("GET", "/elsewhere") is None
    assert not parse([])


def test_values_compare_exactly() -> None:
    r = parse([("health", "K", "sécret")])
    assert r.refusal("health", [("k", "sécret")]) is None
    assert r.refusal("health", [("k", "secret")]) == "K"
    assert r.refusal("health", [("other", "sécret")]) == "K"
    assert r.refusal("health", [("k", "secret"), ("k", "sécret")]) == "K"  # the first decides
    assert message("K") == "This API is restricted, expecting header 'K' with valid value"


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
            assert r.refusal(group_of(method, prefix + tail), []) == "k"
    for route, api in ROUTES.items():  # every route nursery serves: by its own group
        for method in ("GET", "HEAD", "POST"):
            expected = "k" if api in apis else None
            assert r.refusal(group_of(method, route + "/"), []) == expected
