"""The decode loop's slot scheduling under hypothesis: random arrivals, cancellations (of
waiting and running requests) and steps, in each batching mode. After every step: never
more sequences than slots, admission in arrival order, continuous mode leaves no slot idle
while a request waits, a cancelled request gets nothing after its final chunk. At the end
every request has ended exactly once (finished or cancelled) and every slot is free."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nursery.llm.engine import Chunk, DecodeLoop, Job
from nursery.llm.sampling import SamplingParams
from tests.unit.test_llm_engine import ScriptedModel, letters


class DecodeLoopMachine(RuleBasedStateMachine):
    @initialize(slots=st.integers(1, 4), mode=st.sampled_from(["continuous", "static",
                                                               "sequential"]))
    def start(self, slots: int, mode: str) -> None:
        self.model = ScriptedModel()
        self.loop = DecodeLoop(self.model, letters, slots, mode)
        self.slots = 1 if mode == "sequential" else slots
        self.mode = mode
        self.chunks: list[list[Chunk]] = []
        self.gone: list[bool] = []
        self.cancelled_at: dict[int, int] = {}  # request -> chunks it had when cancelled
        self.admitted: list[int] = []  # request numbers, in the order they got a slot
        self.jobs: dict[Job, int] = {}
        self.admit = self.loop.scheduler.admit
        self.loop.scheduler.admit = self.checked_admit  # type: ignore[method-assign]

    @rule(max_tokens=st.integers(1, 6))
    def arrive(self, max_tokens: int) -> None:
        n = len(self.chunks)
        self.chunks.append([])
        self.gone.append(False)
        job = Job([n % 40], max_tokens, self.chunks[n].append, SamplingParams(temperature=0.0),
                  cancelled=lambda n=n: self.gone[n])
        self.jobs[job] = n
        self.loop.submit(job)

    @precondition(lambda self: any(not g for g in self.gone))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        live = [n for n, g in enumerate(self.gone) if not g]
        n = data.draw(st.sampled_from(live))
        self.gone[n] = True
        self.cancelled_at[n] = len(self.chunks[n])

    @rule()
    def step(self) -> None:
        self.loop.pending()
        self.loop.step()

    def checked_admit(self) -> list[tuple[Job, int]]:
        """The scheduler's own ``admit``, watched: FIFO, work-conserving in continuous mode,
        whole batches in the others."""
        scheduler = self.loop.scheduler
        running_before = len(scheduler.active)
        admitted = self.admit()
        self.admitted += [self.jobs[job] for job, _ in admitted]
        if self.mode == "continuous":
            assert not scheduler.waiting or not scheduler._free  # no slot idle while one waits
        elif admitted:
            assert running_before == 0  # a static batch forms only when none runs
        return admitted

    @invariant()
    def never_more_than_slots(self) -> None:
        if hasattr(self, "loop"):
            assert self.loop.active <= self.slots
            assert len(set(self.loop.scheduler.active.values())) == self.loop.active

    @invariant()
    def admission_in_arrival_order(self) -> None:
        if hasattr(self, "loop"):
            assert self.admitted == sorted(self.admitted)

    @invariant()
    def nothing_after_the_end(self) -> None:
        for n, chunks in enumerate(getattr(self, "chunks", [])):
            finals = [i for i, c in enumerate(chunks) if c.final]
            assert finals in ([], [len(chunks) - 1]), f"request {n}: {chunks}"
            if n in self.cancelled_at and chunks and chunks[-1].finish == "cancelled":
                # the cancellation was seen at the next step: one final chunk, no token
                assert len(chunks) == self.cancelled_at[n] + 1

    def teardown(self) -> None:
        if not hasattr(self, "loop"):
            return
        self.loop.pending()
        for _ in range(10_000):
            if self.loop.scheduler.idle:
                break
            self.loop.step()
        assert self.loop.scheduler.idle and self.loop.active == 0
        for n, chunks in enumerate(self.chunks):
            assert chunks and chunks[-1].final, f"request {n} never ended: {chunks}"
            end = chunks[-1].finish
            assert end in ("length", "cancelled"), end
            if end == "length":
                assert sum(c.tokens for c in chunks) == next(
                    job.max_tokens for job, i in self.jobs.items() if i == n)
            else:
                assert self.gone[n]
        assert sorted(self.loop.scheduler._free) == list(range(self.slots))


TestDecodeLoop = DecodeLoopMachine.TestCase
TestDecodeLoop.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
