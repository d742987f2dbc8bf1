"""The continuous decode loop's prefill cap under hypothesis (stall-free batching): the step
cost model, the cap it gives, and the loop on a virtual clock.

``StepCost`` recovers a linear step cost from the steps it is shown; ``prefill_cap`` gives
the most prompt tokens whose step stays within ``1 + overhead`` times the decode rows' cost
alone; ``plan_prefill`` keeps to the cap and the budget and still moves a waiting prompt.
On a virtual clock (a model whose pass advances the clock by a known linear cost, the loop
measuring it as it does the decode thread's CPU time): once the fit has its steps, no step
that carries prompt tokens beside decode rows costs more than that bound (or than one
prompt token beyond it, the token that keeps a prompt moving), and every request still gets
every token it asked for, in the order it gets them alone."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.llm.engine import Chunk, DecodeLoop, Job
from nursery.llm.sampling import SamplingParams
from nursery.llm.slots import StepCost, plan_prefill, prefill_cap
from tests.property.test_llm_prefill import run_arrivals
from tests.unit.test_llm_engine import ScriptedModel, letters

costs = st.tuples(st.floats(1e-4, 2e-2), st.floats(1e-5, 2e-3), st.floats(0.0, 1e-5))


def linear(cost: tuple[float, float, float], rows: int, reads: int) -> float:
    fixed, per_row, per_read = cost
    return fixed + per_row * rows + per_read * reads


@given(cost=costs, steps=st.lists(st.tuples(st.integers(1, 64), st.integers(0, 5000)),
                                  min_size=1, max_size=60),
       memory=st.floats(0.5, 1.0))
def test_the_step_cost_fit_recovers_a_linear_cost(
        cost: tuple[float, float, float], steps: list[tuple[int, int]], memory: float) -> None:
    fit = StepCost(memory=memory, warmup=1)
    for rows, reads in steps:
        fit.observe(rows, reads, linear(cost, rows, reads))
    if len({rows for rows, _ in steps[-3:]}) == 1:
        return  # the last steps alone weigh: maybe no fit, checked below with varied rows
    steps += [(1, steps[-1][1]), (64, steps[-1][1])]
    for rows, reads in steps[-2:]:
        fit.observe(rows, reads, linear(cost, rows, reads))
    assert fit.coef is not None
    for rows, reads in steps[-12:]:  # what it saw it predicts, whatever it could not split
        want = linear(cost, rows, reads)
        got = fit.predict(rows, reads)
        assert got is not None and abs(got - want) <= 1e-6 + 1e-4 * want
    design = np.array(sorted({(1, r, d) for r, d in steps[-12:]}), float)
    if np.linalg.matrix_rank(design) == 3 and np.linalg.cond(design) < 1e4:
        assert abs(fit.coef[1] - cost[1]) <= 1e-3 * cost[1] + 1e-7


def test_steps_of_one_row_count_give_no_fit() -> None:
    """Every step ran 16 rows: the fixed part and a row's cost cannot be told apart."""
    fit = StepCost(warmup=1)
    for reads in range(100, 2000, 50):
        fit.observe(16, reads, 0.01 + 16 * 0.001 + reads * 1e-6)
    assert fit.coef is None and fit.predict(16, 100) is None


@given(cost=costs, decoding=st.integers(1, 64), reads=st.integers(0, 20000),
       overhead=st.floats(0.0, 2.0), more=st.floats(0.0, 1.0))
def test_the_cap_is_the_most_prompt_tokens_within_the_overhead(
        cost: tuple[float, float, float], decoding: int, reads: int, overhead: float,
        more: float) -> None:
    fit = StepCost(warmup=1)
    for rows, r in [(1, 0), (8, 500), (32, 100), (16, 3000)]:
        fit.observe(rows, r, linear(cost, rows, r))
    cap = prefill_cap(fit, decoding, reads, overhead)
    assert cap is not None and cap >= 0
    alone = linear(cost, decoding, reads)
    tol = 1e-6 * alone
    assert linear(cost, decoding + cap, reads) <= (1 + overhead) * alone + tol
    assert linear(cost, decoding + cap + 1, reads) > (1 + overhead) * alone - tol
    # a larger overhead never allows fewer tokens; nothing decoding: no cap
    bigger = prefill_cap(fit, decoding, reads, overhead + more)
    assert bigger is not None and bigger >= cap
    assert prefill_cap(fit, 0, reads, overhead) is None
    # no fit yet: the cap that holds whatever the parts' sizes
    assert prefill_cap(StepCost(), decoding, reads, overhead) == int(overhead * decoding)


@given(budget=st.integers(1, 64), decoding=st.integers(0, 40),
       remaining=st.lists(st.integers(0, 50), max_size=6),
       cap=st.one_of(st.none(), st.integers(0, 40)))
def test_a_capped_plan_keeps_to_the_cap_and_the_budget_and_moves_a_prompt(
        budget: int, decoding: int, remaining: list[int], cap: int | None) -> None:
    plan = plan_prefill(budget, decoding, remaining, cap)
    room = budget - decoding if cap is None else min(budget - decoding, cap)
    assert all(0 <= take <= want for take, want in zip(plan, remaining, strict=True))
    assert sum(plan) == min(max(room, 1 if any(remaining) else 0), sum(remaining))


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CostedModel(ScriptedModel):
    """The scripted model (greedy: last token + 1), each pass advancing the virtual clock by
    a linear cost of its rows and of the cache positions its decode rows read; it records
    every pass as (decode rows, prompt tokens, reads of the decode rows, cost)."""

    def __init__(self, clock: VirtualClock, cost: tuple[float, float, float]) -> None:
        super().__init__()
        self.clock, self.cost = clock, cost
        self.lengths: dict[int, int] = {}
        self.passes: list[tuple[int, int, int, float]] = []

    def step(self, slots: Sequence[int], tokens: Sequence[int],
             adapters: Sequence[int] | None,
             prefills: Sequence[tuple[int, Sequence[int], int, int]] = ()
             ) -> tuple[np.ndarray, np.ndarray]:
        decode_reads = sum(self.lengths.get(s, 0) + 1 for s in slots)
        prompt = sum(len(ids) for _, ids, _, _ in prefills)
        seconds = linear(self.cost, len(slots) + prompt, decode_reads)
        self.clock.now += seconds
        self.passes.append((len(slots), prompt, decode_reads, seconds))
        for s in slots:
            self.lengths[s] = self.lengths.get(s, 0) + 1
        for slot, ids, _, start in prefills:
            self.lengths[slot] = start + len(ids)
        return super().step(slots, tokens, adapters, prefills)


@settings(max_examples=120, deadline=None)
@given(cost=costs, overhead=st.floats(0.0, 1.0), slots=st.integers(2, 8),
       budget=st.integers(1, 64),
       requests=st.lists(st.tuples(st.integers(1, 30),  # prompt length
                                   st.integers(1, 12),  # max_tokens
                                   st.integers(0, 12)),  # steps before it arrives
                         min_size=2, max_size=12))
def test_on_a_virtual_clock_prompts_never_stall_decoding_beyond_the_overhead(
        cost: tuple[float, float, float], overhead: float, slots: int, budget: int,
        requests: list[tuple[int, int, int]]) -> None:
    clock = VirtualClock()
    model = CostedModel(clock, cost)
    loop = DecodeLoop(model, letters, slots, "continuous", token_budget=budget,
                      prefill_overhead=overhead, clock=clock)
    loop.cost.warmup = 3
    got: list[list[Chunk]] = [[] for _ in requests]
    jobs = [Job([(7 * i + j) % 40 for j in range(n)], m, got[i].append,
                SamplingParams(temperature=0.0)) for i, (n, m, _) in enumerate(requests)]
    run_arrivals(loop, jobs, [wait for *_, wait in requests])
    for n, (decoding, prompt, reads, seconds) in enumerate(model.passes):
        if decoding and prompt > 1:  # from the first step: before a fit, the safe cap
            alone = linear(cost, decoding, reads)
            assert seconds <= (1 + overhead) * alone * (1 + 1e-6), (n, decoding, prompt)
        assert decoding + prompt <= max(budget, decoding + 1)
    for i, (_, m, _) in enumerate(requests):  # every token, as alone: last prompt token + 1..
        last = jobs[i].prompt[-1]
        assert "".join(c.text for c in got[i]) == "".join(
            letters((last + k) % 50).decode() for k in range(1, m + 1))
        assert got[i][-1].final and got[i][-1].finish == "length"
