"""Chunked prefill under hypothesis, on the real numpy decoder: random prompts (lengths,
LoRA adapters, output lengths), random token budgets and slot counts, requests arriving at
random steps. Greedy decoding through the decode loop, its prompts spread over as many steps
as the budget makes them, gives every request the tokens it gets alone, its prompt run in one
piece and decoded one request at a time. Along the way: no step runs more rows than the
budget allows (every decoding sequence's token, then prompt tokens; at least one prompt token
while a prompt waits), and a sequence sends nothing before its prompt's last chunk ran."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.llm.decoder import Decoder
from nursery.llm.engine import Chunk, DecodeLoop, Job
from nursery.llm.sampling import SamplingParams
from nursery.llm.slots import plan_prefill
from tests.unit.test_llm_decoder import CONFIG, adapter, greedy_tokens, weights

ADAPTERS = (adapter("alpha", 4, 1), adapter("beta", 8, 2))


@cache
def alone(prompt: tuple[int, ...], n: int, lora: int) -> tuple[int, ...]:
    """The reference: this prompt alone, prefilled in one piece, decoded greedily."""
    return tuple(greedy_tokens(Decoder(CONFIG, weights(), 1, ADAPTERS), 0, list(prompt), n,
                               lora))


class Watched(Decoder):
    """The decoder, with every pass's row counts and the requests' chunks checked."""

    def __init__(self, slots: int, budget: int) -> None:
        super().__init__(CONFIG, weights(), slots, ADAPTERS)
        self.budget = budget
        self.passes = 0

    def step(self, slots: Sequence[int], tokens: Sequence[int], adapters: Sequence[int] | None,
             prefills: Sequence[tuple[int, Sequence[int], int, int]] = ()
             ) -> tuple[np.ndarray, np.ndarray]:
        prompt_rows = sum(len(ids) for _, ids, _, _ in prefills)
        assert len(slots) + prompt_rows <= max(self.budget, len(slots) + 1)
        self.passes += 1
        return super().step(slots, tokens, adapters, prefills)


requests = st.lists(st.tuples(st.lists(st.integers(2, CONFIG.vocab_size - 1), min_size=1,
                                       max_size=40),
                              st.integers(1, 8),  # max_tokens
                              st.integers(0, len(ADAPTERS)),  # 0: no adapter
                              st.integers(0, 6)),  # steps to wait before arriving
                    min_size=1, max_size=6)


def run_arrivals(loop: DecodeLoop, jobs: list[Job], waits: list[int]) -> None:
    """Submit each job once the loop has taken ``waits[i]`` steps (arrival order: by wait),
    then step until every job is done."""
    for i in sorted(range(len(jobs)), key=lambda i: waits[i]):
        while loop.steps < waits[i]:
            loop.pending()
            loop.step()
        loop.submit(jobs[i])
    loop.pending()
    while not loop.scheduler.idle:
        loop.step()


@settings(max_examples=150, deadline=None)
@given(requests=requests, budget=st.integers(1, 48), slots=st.integers(1, 4),
       mode=st.sampled_from(["continuous", "continuous", "static"]))
def test_chunked_prefill_gives_every_request_its_tokens_alone(
        requests: list[tuple[list[int], int, int, int]], budget: int, slots: int,
        mode: str) -> None:
    model = Watched(slots, budget)
    loop = DecodeLoop(model, lambda t: f"{t} ".encode(), slots, mode, token_budget=budget)
    got: list[list[Chunk]] = [[] for _ in requests]

    def emit(i: int) -> Callable[[Chunk], None]:
        def put(chunk: Chunk) -> None:
            # nothing before the prompt's last chunk ran: its first token comes with it
            assert loop._running.get(jobs[i]) is None or loop._running[jobs[i]].decoding
            got[i].append(chunk)
        return put

    jobs = [Job(prompt, n, emit(i), SamplingParams(temperature=0.0), lora)
            for i, (prompt, n, lora, _) in enumerate(requests)]
    run_arrivals(loop, jobs, [wait for *_, wait in requests])
    for i, (prompt, n, lora, _) in enumerate(requests):
        text = "".join(c.text for c in got[i])
        assert [int(t) for t in text.split()] == list(alone(tuple(prompt), n, lora)), i
        assert got[i][-1].final and got[i][-1].finish == "length"
        assert sum(c.tokens for c in got[i]) == n
    assert sorted(loop.scheduler._free) == list(range(loop.scheduler.slots))


@given(budget=st.integers(1, 64), decoding=st.integers(0, 40),
       remaining=st.lists(st.integers(0, 50), max_size=6))
def test_a_plan_fills_the_budget_first_come_first_served(
        budget: int, decoding: int, remaining: list[int]) -> None:
    plan = plan_prefill(budget, decoding, remaining)
    assert len(plan) == len(remaining)
    assert all(0 <= take <= want for take, want in zip(plan, remaining, strict=True))
    if any(remaining):
        room = max(budget - decoding, 1)
        assert sum(plan) == min(room, sum(remaining))  # never idle while a prompt waits
        # first come, first served: a prompt gets tokens only when those before it have all
        for before, take in enumerate(plan):
            if take:
                assert all(plan[j] == remaining[j] for j in range(before))
    else:
        assert sum(plan) == 0


@settings(max_examples=100, deadline=None)
@given(data=st.data(), slots=st.integers(1, 6))
def test_a_fused_step_equals_its_decode_rows_and_chunks_run_apart(
        data: st.DataObject, slots: int) -> None:
    """One ``Decoder.step`` with decode rows and prompt chunks together (any slots, adapters,
    chunk offsets) gives the logits, and leaves the caches, that the decode rows in a pass
    of their own and then each chunk in a pass of its own give."""
    ids = st.lists(st.integers(2, CONFIG.vocab_size - 1), min_size=1, max_size=20)
    lora = st.integers(0, len(ADAPTERS))
    history = data.draw(st.lists(st.one_of(st.none(), st.tuples(ids, lora)),
                                 min_size=slots, max_size=slots), "prompts already run")
    fused, apart = (Decoder(CONFIG, weights(), slots, ADAPTERS) for _ in range(2))
    for model in (fused, apart):
        for slot, past in enumerate(history):
            if past is not None:
                model.prefill(slot, past[0], past[1])
    decode, tokens, adapters = [], [], []
    prefills: list[tuple[int, Sequence[int], int, int]] = []
    for slot in data.draw(st.permutations(range(slots)), "slot order"):
        role = data.draw(st.sampled_from(["decode", "chunk", "idle"]
                                         if history[slot] else ["chunk", "idle"]))
        if role == "decode":
            decode.append(slot)
            tokens.append(data.draw(st.integers(2, CONFIG.vocab_size - 1)))
            adapters.append(data.draw(lora))
        elif role == "chunk":
            go_on = history[slot] is not None and data.draw(st.booleans(), "continue its prompt")
            start = len(history[slot][0]) if go_on and history[slot] else 0
            prefills.append((slot, data.draw(ids), data.draw(lora), start))
    if not decode and not prefills:
        return
    got = fused.step(decode, tokens, adapters, prefills)
    want_decode = apart.step(decode, tokens, adapters)[0]
    want_chunks = [apart.step((), (), None, [chunk])[1][0] for chunk in prefills]
    np.testing.assert_allclose(got[0], want_decode, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], np.array(want_chunks).reshape(-1, CONFIG.vocab_size),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(fused.lengths, apart.lengths)
    # the caches hold the same keys and values: the next token of every slot agrees
    live = [slot for slot in range(slots) if fused.lengths[slot]]
    if live:
        np.testing.assert_allclose(fused.decode(live, [3] * len(live)),
                                   apart.decode(live, [3] * len(live)), rtol=1e-4, atol=1e-4)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), slots=st.integers(1, 6))
def test_decode_rows_attend_alike_over_the_span_and_row_by_row(
        data: st.DataObject, slots: int) -> None:
    """The decode rows' two ways of attending (one product over the slot span, each row
    padded to the widest; or a product per row over its own length) give the same logits
    and leave the same caches, for any slots, lengths and subset of decoding rows."""
    ids = st.lists(st.integers(2, CONFIG.vocab_size - 1), min_size=1, max_size=30)
    prompts = data.draw(st.lists(ids, min_size=slots, max_size=slots), "prompts")
    rows = sorted(data.draw(st.sets(st.integers(0, slots - 1), min_size=1), "decoding"))
    tokens = data.draw(st.lists(st.integers(2, CONFIG.vocab_size - 1), min_size=len(rows),
                                max_size=len(rows)), "tokens")
    got = []
    for ragged in (10**9, -10**9):  # never row by row; always
        model = Decoder(CONFIG, weights(), slots, ADAPTERS)
        for slot, prompt in enumerate(prompts):
            model.prefill(slot, prompt)
        model.ragged_rows = ragged
        got.append((model.decode(rows, tokens), model.decode(rows, tokens[::-1])))
    for a, b in zip(*got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
