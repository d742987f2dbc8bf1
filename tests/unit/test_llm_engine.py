"""The decode loop and its slot scheduler, driven step by step (no thread): admission into
free slots at every step, a finished sequence's slot taken at the next step, a cancelled
request stopped within one step, static and one-at-a-time modes, stop strings and the
end-of-sequence token, failures that cost one sequence."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import pytest

from nursery.llm.engine import Chunk, DecodeLoop, Job
from nursery.llm.sampling import Sampler, SamplingParams, TextStream
from nursery.llm.slots import SlotScheduler

VOCAB = 50


class ScriptedModel:
    """Logits that make greedy decoding emit ``(last token + 1) % VOCAB``; records every
    call, so a test sees which slots each step ran."""

    n_ctx = 256

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.chunks: list[list[tuple[int, int, int]]] = []  # per pass: (slot, length, start)
        self.fail_prefill_for: set[int] = set()

    def _row(self, token: int) -> np.ndarray:
        row = np.zeros(VOCAB, np.float32)
        row[(token + 1) % VOCAB] = 1.0
        return row

    def step(self, slots: Sequence[int], tokens: Sequence[int],
             adapters: Sequence[int] | None,
             prefills: Sequence[tuple[int, Sequence[int], int, int]] = ()
             ) -> tuple[np.ndarray, np.ndarray]:
        if prefills:
            self.calls.append(("prefill", [slot for slot, _, _, _ in prefills]))
            self.chunks.append([(slot, len(ids), start) for slot, ids, _, start in prefills])
        if slots:
            self.calls.append(("decode", list(slots)))
        if any(ids[0] in self.fail_prefill_for for _, ids, _, _ in prefills):
            raise RuntimeError("boom")
        empty = np.zeros((0, VOCAB), np.float32)
        decoded = np.stack([self._row(t) for t in tokens]) if len(tokens) else empty
        prefilled = np.stack([self._row(ids[-1]) for _, ids, _, _ in prefills]) if prefills \
            else empty
        return decoded, prefilled


class Client:
    """A request's side: the chunks it got, and a cancel switch."""

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.gone = False

    def job(self, prompt: list[int], max_tokens: int, **kw: object) -> Job:
        return Job(prompt, max_tokens, self.chunks.append, SamplingParams(temperature=0.0),
                   cancelled=lambda: self.gone, **kw)  # type: ignore[arg-type]

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    @property
    def final(self) -> Chunk | None:
        return self.chunks[-1] if self.chunks and self.chunks[-1].final else None


def letters(token: int) -> bytes:
    return bytes([ord("a") + token % 26])


def loop_with(slots: int, mode: str = "continuous", eos: tuple[int, ...] = (),
              budget: int | None = None) -> tuple[DecodeLoop, ScriptedModel]:
    model = ScriptedModel()
    # the token budget alone: the prefill cap follows measured costs (test_llm_prefill_cap)
    return DecodeLoop(model, letters, slots, mode, eos_ids=eos, token_budget=budget,
                      prefill_overhead=None), model


def step(loop: DecodeLoop) -> None:
    loop.pending()
    loop.step()


def drain(loop: DecodeLoop) -> None:
    """Steps until every submitted request has ended."""
    loop.pending()
    while not loop.scheduler.idle:
        step(loop)


def test_new_requests_join_the_running_batch_at_the_next_step() -> None:
    loop, model = loop_with(4)
    a, b = Client(), Client()
    loop.submit(a.job([0], 10))
    step(loop)
    assert model.calls == [("prefill", [0])]
    step(loop)
    loop.submit(b.job([5], 10))
    step(loop)  # b's prompt runs in the same pass as a's next token
    assert model.calls[1:] == [("decode", [0]), ("prefill", [1]), ("decode", [0])]
    step(loop)
    assert model.calls[-1] == ("decode", [0, 1])
    assert len(a.chunks) == 4 and len(b.chunks) == 2


def test_a_finished_sequence_frees_its_slot_for_the_next_step() -> None:
    loop, model = loop_with(1)
    a, b = Client(), Client()
    loop.submit(a.job([0], 3))
    loop.submit(b.job([10], 3))
    step(loop)  # a: token 1
    step(loop)  # a: token 2
    assert loop.waiting == 1 and loop.active == 1
    step(loop)  # a's third token ends it: its slot is free before this step is over
    assert a.final is not None and a.final.finish == "length" and a.text == "bcd"
    assert loop.active == 0 and loop.waiting == 1
    step(loop)  # b takes slot 0 at once
    assert ("prefill", [0]) == model.calls[-1] and b.text == "l"


def test_a_cancelled_request_stops_within_one_step_and_frees_its_slot() -> None:
    loop, model = loop_with(2)
    a, b, c = Client(), Client(), Client()
    loop.submit(a.job([0], 100))
    loop.submit(b.job([10], 100))
    loop.submit(c.job([20], 100))
    step(loop)
    assert loop.active == 2 and loop.waiting == 1
    before = len(a.chunks)
    a.gone = True  # the client left: is_cancelled() turns true
    step(loop)
    assert a.final is not None and a.final.finish == "cancelled"
    assert len(a.chunks) == before + 1  # no token after the cancellation, only the final word
    # the step that noticed it ran c's prompt in a's slot and never decoded a again
    assert model.calls[-2:] == [("prefill", [0]), ("decode", [1])]
    assert c.chunks and loop.active == 2 and loop.outcomes["cancelled"] == 1


def test_a_request_cancelled_while_waiting_never_runs() -> None:
    loop, model = loop_with(1)
    a, b = Client(), Client()
    loop.submit(a.job([0], 50))
    loop.submit(b.job([10], 50))
    step(loop)
    b.gone = True
    step(loop)
    assert b.final is not None and b.final.finish == "cancelled" and len(b.chunks) == 1
    assert loop.waiting == 0 and all(slots == [0] for _, slots in model.calls)


def test_static_batches_run_to_their_end_before_the_next_forms() -> None:
    loop, model = loop_with(2, "static")
    short, long, late = Client(), Client(), Client()
    loop.submit(short.job([0], 2))
    loop.submit(long.job([10], 6))
    step(loop)
    loop.submit(late.job([20], 2))
    for _ in range(2):
        step(loop)
    assert short.final is not None and loop.active == 1 and not late.chunks  # a free slot, idle
    while long.final is None:
        step(loop)
    step(loop)
    assert late.chunks


def test_sequential_runs_one_request_at_a_time() -> None:
    loop, model = loop_with(8, "sequential")
    clients = [Client() for _ in range(3)]
    for i, client in enumerate(clients):
        loop.submit(client.job([i * 10], 3))
    loop.pending()
    while not loop.scheduler.idle:
        step(loop)
        assert loop.active <= 1
    assert [c.text for c in clients] == ["bcd", "lmn", "vwx"]
    assert {tuple(slots) for _, slots in model.calls} == {(0,)}


def test_end_of_sequence_and_stop_strings_end_a_sequence() -> None:
    loop, _ = loop_with(4, eos=(4,))
    eos, stop = Client(), Client()
    loop.submit(eos.job([0], 20))  # 1, 2, 3, then 4: the end-of-sequence token
    loop.submit(stop.job([10], 20, stop=["nop"]))  # l m n o p ...
    drain(loop)
    assert eos.text == "bcd" and eos.final is not None and eos.final.finish == "stop"
    assert eos.final.tokens == 1  # the end-of-sequence token counts, as a token without text
    assert stop.text == "lm" and stop.final is not None and stop.final.finish == "stop"


def test_a_failing_prefill_costs_its_own_request_only() -> None:
    loop, model = loop_with(4)
    model.fail_prefill_for = {7}
    good, bad = Client(), Client()
    loop.submit(good.job([0], 4))
    loop.submit(bad.job([7], 4))
    drain(loop)
    assert bad.final is not None and bad.final.finish == "error" and "boom" in str(bad.final.error)
    assert good.text == "bcde" and loop.active == 0


def test_the_thread_serves_and_close_answers_what_is_left() -> None:
    loop, _ = loop_with(1)
    loop.start()
    done = Client()
    loop.submit(done.job([0], 3))
    for _ in range(2000):
        if done.final is not None:
            break
        time.sleep(0.005)
    assert done.text == "bcd"
    endless = Client()
    endless.job([0], 10**9)  # never submitted: close must not wait for anything
    loop.close()
    stuck = DecodeLoop(ScriptedModel(), letters, 1)
    waiting = Client()
    stuck.submit(waiting.job([0], 5))
    stuck.close()  # never started: the request still gets its final answer
    assert waiting.final is not None and waiting.final.error == "the model is unloading"


def test_slot_scheduler_modes_and_refusals() -> None:
    with pytest.raises(ValueError, match="batching_mode"):
        SlotScheduler(4, "eager")
    with pytest.raises(ValueError, match="at least 1"):
        SlotScheduler(0)
    s: SlotScheduler[str] = SlotScheduler(2)
    for key in "abc":
        s.submit(key)
    assert s.admit() == [("a", 0), ("b", 1)]
    s.finish("a")
    s.cancel("zzz")  # unknown: nothing happens
    assert s.admit() == [("c", 0)]


def test_sampling_is_reproducible_with_a_seed_and_respects_top_k_and_top_p() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    draw = lambda p: [Sampler(p, np.random.default_rng(p.seed)).next_token(logits, [])  # noqa: E731
                      for _ in range(1)]
    params = SamplingParams(temperature=1.0, seed=7)
    assert draw(params) == draw(params)
    rng = np.random.default_rng(0)
    top_k = Sampler(SamplingParams(top_k=2), rng)
    assert {top_k.next_token(logits, []) for _ in range(200)} == {0, 1}
    top_p = Sampler(SamplingParams(top_p=0.6), rng)  # 0.5 alone is short of 0.6: two kept
    assert {top_p.next_token(logits, []) for _ in range(200)} == {0, 1}
    assert Sampler(SamplingParams(temperature=0.0), rng).next_token(logits, []) == 0
    banned = Sampler(SamplingParams(temperature=0.0), rng, bad_words=[[0], [5, 1]])
    assert banned.next_token(logits, [3]) == 1
    assert banned.next_token(logits, [5]) == 2  # [5, 1] banned after 5
    assert SamplingParams(top_p=0).problem() and SamplingParams(temperature=-1).problem()


def test_text_stream_holds_partial_characters_and_possible_stop_strings() -> None:
    pieces = {1: b"h", 2: "é".encode()[:1], 3: "é".encode()[1:], 4: b"#", 5: b"#",
              6: b"!"}
    stream = TextStream(lambda t: pieces[t], stop=["##!"])
    assert stream.push(1) == ("h", False)
    assert stream.push(2) == ("", False)  # half a character waits
    assert stream.push(3) == ("é", False)
    assert stream.push(4) == ("", False)  # "#" may start "##!"
    assert stream.push(5) == ("", False)
    assert stream.push(6) == ("", True)  # the stop string: never sent
    assert stream.text == "hé"
    assert stream.finish() == ""
    tail = TextStream(lambda t: {1: b"ab", 2: b"c\xc3"}[t], stop=["bc"])
    assert tail.push(1) == ("a", False)  # "b" may start "bc"
    assert tail.push(2) == ("", True) and tail.finish() == ""  # nothing after the stop
    loose = TextStream(lambda t: pieces[t], stop=["##!"])
    for t in (4, 5):
        loose.push(t)
    assert loose.push(1) == ("##h", False) and loose.finish() == ""


def test_the_observer_sees_every_step_even_one_that_only_cancels() -> None:
    seen: list[tuple[int, int, int]] = []
    loop = DecodeLoop(ScriptedModel(), letters, 2,
                      observe=lambda lp: seen.append((lp.active, lp.waiting,
                                                      lp.outcomes["cancelled"])))
    only = Client()
    loop.submit(only.job([0], 100))
    step(loop)
    only.gone = True
    step(loop)  # nothing left to run: the step still reports the freed slot
    assert seen == [(1, 0, 0), (0, 0, 1)]


def test_a_long_prompt_is_spread_over_steps_within_the_token_budget() -> None:
    """Chunked prefill: with a budget of 4 tokens a step, one decoding sequence leaves room
    for 3 prompt tokens; a 10-token prompt runs in chunks of 3, 3, 3, 1 at their offsets
    while the running sequence gets a token every step, and it says nothing until its last
    chunk, which gives its first token."""
    loop, model = loop_with(4, budget=4)
    running, late = Client(), Client()
    loop.submit(running.job([0], 50))
    step(loop)
    loop.submit(late.job(list(range(10, 20)), 5))
    for _ in range(3):
        step(loop)
        assert not late.chunks
    step(loop)
    assert model.chunks[1:] == [[(1, 3, 0)], [(1, 3, 3)], [(1, 3, 6)], [(1, 1, 9)]]
    assert late.text == "u"  # the last prompt token is 19: the scripted model answers 20
    assert len(running.chunks) == 5  # its first token, then one every step
    step(loop)
    assert model.calls[-1] == ("decode", [0, 1])


def test_prompts_share_the_budget_first_come_first_served() -> None:
    loop, model = loop_with(4, budget=6)
    first, second = Client(), Client()
    loop.submit(first.job(list(range(8)), 3))
    loop.submit(second.job(list(range(20, 24)), 3))
    step(loop)  # 6 tokens: all for the first prompt
    step(loop)  # its last 2, then 4 of the second: both finish their prompts
    assert model.chunks == [[(0, 6, 0)], [(0, 2, 6), (1, 4, 0)]]
    assert first.text == "i" and second.text == "y"


def test_a_small_budget_still_moves_a_prompt_every_step() -> None:
    """A budget the decoding sequences use up leaves one prompt token a step, never none."""
    loop, model = loop_with(3, budget=1)
    a, b, c = Client(), Client(), Client()
    loop.submit(a.job([0], 30))
    loop.submit(b.job([5], 30))
    step(loop)
    step(loop)
    loop.submit(c.job([1, 2, 3], 5))
    for _ in range(3):
        step(loop)
    assert model.chunks[-3:] == [[(2, 1, 0)], [(2, 1, 1)], [(2, 1, 2)]]
    assert c.text == "e" and len(a.chunks) == 5


def test_a_request_cancelled_in_prefill_stops_within_one_step_and_frees_its_slot() -> None:
    loop, model = loop_with(2, budget=2)
    long, next_ = Client(), Client()
    loop.submit(long.job(list(range(30)), 5))
    loop.submit(next_.job([7], 3))
    step(loop)
    step(loop)
    long.gone = True
    step(loop)  # seen at once: no more of its chunks; the prompt behind it runs now
    assert long.final is not None and long.final.finish == "cancelled" and len(long.chunks) == 1
    assert all(slot != 0 for slot, _, _ in model.chunks[-1])
    drain(loop)
    assert next_.text == "ijk" and sorted(loop.scheduler._free) == [0, 1]


def test_a_failing_prompt_chunk_costs_its_own_request_only() -> None:
    loop, model = loop_with(4, budget=3)
    model.fail_prefill_for = {7}
    good, bad = Client(), Client()
    loop.submit(good.job([0, 1, 2, 3, 4], 4))
    loop.submit(bad.job([7, 8, 9], 4))
    drain(loop)
    assert bad.final is not None and bad.final.finish == "error" and "boom" in str(bad.final.error)
    assert good.text == "fghi" and loop.active == 0


def test_a_budget_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens must be at least 1"):
        DecodeLoop(ScriptedModel(), letters, 2, token_budget=0)


def test_each_step_sends_its_responses_inside_one_coalesce_block() -> None:
    """What a step emits for all its sequences is emitted inside one ``coalesce()`` block
    (the server then carries it together); a cancellation's final word goes in a block of
    its own before the step's pass."""
    blocks: list[list[str]] = []
    current: list[list[str]] = []

    @contextmanager
    def coalesce() -> Iterator[None]:
        current.append([])
        yield
        blocks.append(current.pop())

    def emit(name: str) -> Callable[[Chunk], None]:
        return lambda chunk: current[-1].append(name + ("!" if chunk.final else ""))

    loop = DecodeLoop(ScriptedModel(), letters, 4, coalesce=coalesce)
    gone = {"c": False}
    for name, n in (("a", 2), ("b", 3), ("c", 9)):
        loop.submit(Job([1], n, emit(name), SamplingParams(temperature=0.0),
                        cancelled=lambda name=name: gone.get(name, False)))
    step(loop)
    step(loop)
    gone["c"] = True
    step(loop)
    assert blocks == [[], ["a", "b", "c"], [], ["a!", "b", "c"], ["c!"], ["b!"]]


def test_an_empty_prompt_is_refused_and_frees_its_slot() -> None:
    loop, model = loop_with(1)
    empty, next_ = Client(), Client()
    loop.submit(empty.job([], 5))
    loop.submit(next_.job([3], 2))
    step(loop)
    assert empty.final is not None and empty.final.finish == "error"
    assert empty.final.error == "a prompt must have at least one token" and not model.calls
    drain(loop)
    assert next_.text == "ef"
