"""The LRU policy of ``--model-load-budget`` (nursery/scheduling/model_budget.py), proven with
hypothesis: it never unloads a busy, pinned or just-requested model; once loads settle the
loaded models fit the budget whenever the spared ones do; a working set that fits is never
unloaded (no thrash); and it unloads the least recently used first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.scheduling.model_budget import Budget, LruBudget, parse_budget

NAMES = [f"m{i}" for i in range(8)]
SIZES = {name: 10 * (i + 1) for i, name in enumerate(NAMES)}

budgets = st.builds(Budget, st.one_of(st.none(), st.integers(1, 6)),
                    st.one_of(st.none(), st.integers(10, 250)))
steps = st.lists(st.tuples(st.sampled_from(NAMES), st.sets(st.sampled_from(NAMES)),
                           st.booleans()), max_size=60)


def _simulate(budget: Budget, trace: list[tuple[str, set[str], bool]],
              pinned: frozenset[str] = frozenset()) -> tuple[LruBudget, list[str]]:
    """Requests in order: (model asked for, models busy meanwhile, whether it finishes the
    busy ones first). A request loads its model if needed, then unloads the victims."""
    policy = LruBudget(budget)
    evicted: list[str] = []
    for name, busy, _ in trace:
        if name in policy.resident:
            policy.used(name)
        else:
            policy.loaded(name, SIZES[name])
        busy_loaded = busy & set(policy.resident)
        victims = policy.victims(busy_loaded, pinned, keep=name)
        assert name not in victims
        assert not set(victims) & busy_loaded
        assert not set(victims) & pinned
        assert len(victims) == len(set(victims))
        for victim in victims:
            policy.unloaded(victim)
        evicted += victims
        spared = {name, *busy_loaded, *(pinned & set(policy.resident))}
        if budget.fits(len(spared), sum(SIZES[n] for n in spared)):
            # whenever the spared models fit, what remains after the unloads fits
            assert policy.within(), (budget, dict(policy.resident), spared)
    return policy, evicted


@settings(max_examples=300, deadline=None)
@given(budgets, steps, st.frozensets(st.sampled_from(NAMES), max_size=2))
def test_never_a_busy_or_pinned_model_and_within_the_budget(
        budget: Budget, trace: list[tuple[str, set[str], bool]], pinned: frozenset[str]) -> None:
    _simulate(budget, trace, pinned)


@settings(max_examples=300, deadline=None)
@given(budgets, st.lists(st.sampled_from(NAMES), min_size=1, max_size=80), st.data())
def test_a_working_set_that_fits_is_never_unloaded(budget: Budget, warmup: list[str],
                                                   data: st.DataObject) -> None:
    # a fixed working set that fits the budget, requested over and over after any warm-up
    working = data.draw(st.sets(st.sampled_from(NAMES), min_size=1))
    if not budget.fits(len(working), sum(SIZES[n] for n in working)):
        working = {min(working, key=lambda n: SIZES[n])}
        if not budget.fits(1, SIZES[next(iter(working))]):
            return
    order = data.draw(st.lists(st.sampled_from(sorted(working)), min_size=len(working) * 3,
                               max_size=120))
    policy = LruBudget(budget)
    for name in warmup:
        if name in policy.resident:
            policy.used(name)
        else:
            policy.loaded(name, SIZES[name])
        for victim in policy.victims(keep=name):
            policy.unloaded(victim)
    seen: set[str] = set()
    for name in order:
        if name in policy.resident:
            policy.used(name)
        else:
            # once every working model was loaded, none is ever unloaded again: no thrash
            assert name not in seen, "a model of a working set that fits was unloaded"
            policy.loaded(name, SIZES[name])
        seen.add(name)
        for victim in policy.victims(keep=name):
            assert victim not in seen, "a model of a working set that fits was unloaded"
            policy.unloaded(victim)
    assert set(order) <= set(policy.resident)


def test_least_recently_used_goes_first() -> None:
    policy = LruBudget(Budget(models=2))
    policy.loaded("a", 1)
    policy.loaded("b", 1)
    policy.used("a")
    policy.loaded("c", 1)
    assert policy.victims(keep="c") == ["b"]
    assert policy.victims(busy={"b"}, keep="c") == ["a"]
    assert policy.victims(busy={"b"}, pinned={"a"}, keep="c") == []
    policy.adopt("z", 1)  # found loaded, never used: first to go
    assert policy.victims(keep="c") == ["z", "b"]


def test_bytes_budget() -> None:
    policy = LruBudget(Budget(bytes=100))
    policy.loaded("small", 30)
    policy.loaded("big", 80)
    assert policy.victims(keep="big") == ["small"]
    policy.unloaded("small")
    assert policy.within()


@pytest.mark.parametrize(("entries", "want"), [
    (["models=4"], Budget(4, None)),
    (["bytes=2G"], Budget(None, 2_000_000_000)),
    (["models=3,bytes=512Mi"], Budget(3, 512 * 1024**2)),
    (["models=3", "bytes=100"], Budget(3, 100)),
])
def test_parse_budget(entries: list[str], want: Budget) -> None:
    assert parse_budget(entries) == want


@pytest.mark.parametrize("bad", ["models=0", "models=x", "bytes=12Q", "count=3", "bytes=0"])
def test_parse_budget_refuses(bad: str) -> None:
    with pytest.raises(ValueError, match="is not|must be more than 0"):
        parse_budget([bad])
