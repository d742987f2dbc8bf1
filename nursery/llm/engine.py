"""The decode loop: one thread that runs every sequence of a model instance, step by step.

Each step: (1) requests whose client has gone are dropped, waiting or running, and their
slots freed; (2) the slot scheduler admits waiting requests into free slots (every step in
``continuous`` mode); (3) one forward pass gives every decoding sequence its next token and
runs prompt tokens of the admitted ones, as many as the step's token budget leaves (chunked
prefill: a long prompt is spread over several steps, so it never stalls the sequences
already decoding for more than a budget's worth of rows) and, in ``continuous`` mode with
``prefill_overhead`` set, no more than keeps the step within ``1 + prefill_overhead`` times
what its decode rows cost alone (``slots.prefill_cap``, from the cost of the steps measured so far: the decode
thread's CPU time per pass, so a busy machine's preemptions do not count); a sequence whose
last prompt chunk ran gets its first token; a sequence that ends (end-of-sequence token, stop string,
``max_tokens``) leaves at once and its slot is free for the next step. A pass that fails is
run again in parts, so that only the sequences whose part fails again end with the error.

``execute`` of a decoupled ``model.py`` only hands requests over (``submit``) and returns;
what a sequence produces goes out through its job's ``emit`` callback, on this thread, as
``Chunk``s: one per token, then a final one. What one step emits for all its sequences is
sent inside one ``coalesce()`` block, so a server that can carry the responses of a block
together does (``triton_python_backend_utils.coalesce_responses`` in nursery). ``step`` is
public so tests drive the loop synchronously, without the thread.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol, TextIO

import numpy as np

from nursery.llm.sampling import Sampler, SamplingParams, TextStream
from nursery.llm.slots import SlotScheduler, StepCost, plan_prefill, prefill_cap

log = logging.getLogger("nursery.llm")

# what a continuous step that carries prompt tokens may cost beyond its decode rows alone
# (None: no cap but the token budget; measured in bench/README.md, where a cap cost more
# throughput and time to first token than it gave in inter-token latency)
PREFILL_OVERHEAD: float | None = None


class BatchModel(Protocol):
    """What the loop needs of a model (``decoder.Decoder`` is one): ``step`` decodes one token
    for each of ``slots`` and, in the same pass, runs each prompt chunk of ``prefills``
    (``(slot, ids, adapter, start)``: ``ids`` at positions ``start ..`` of the slot; 0 starts
    the slot over) into its slot; it returns the decode rows' logits and one row per chunk
    (its last position)."""

    n_ctx: int

    def step(self, slots: Sequence[int], tokens: Sequence[int], adapters: Sequence[int] | None,
             prefills: Sequence[tuple[int, Sequence[int], int, int]] = ()
             ) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class Chunk:
    """What one step gave one sequence. ``tokens``: tokens sampled for it in this chunk;
    ``finish``: on the final chunk, "stop" (end-of-sequence token or stop string), "length"
    (``max_tokens``), "cancelled" (the client left) or "error" (then ``error`` says why)."""

    text: str
    tokens: int
    final: bool = False
    finish: str | None = None
    error: str | None = None


@dataclass(eq=False)
class Job:
    prompt: Sequence[int]
    max_tokens: int
    emit: Callable[[Chunk], None]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    adapter: int = 0
    stop: Sequence[str] = ()
    bad_words: Sequence[Sequence[int]] = ()
    cancelled: Callable[[], bool] = lambda: False


@dataclass(eq=False)
class _Sequence:
    job: Job
    slot: int
    sampler: Sampler
    stream: TextStream
    generated: list[int] = field(default_factory=list)
    last: int = 0
    fed: int = 0  # prompt tokens run into the slot so far

    @property
    def decoding(self) -> bool:
        return self.fed == len(self.job.prompt)


class DecodeLoop:
    def __init__(self, model: BatchModel, token_bytes: Callable[[int], bytes], slots: int,
                 mode: str = "continuous", eos_ids: Collection[int] = (),
                 seed: int | None = None, name: str = "llm",
                 observe: Callable[[DecodeLoop], None] | None = None,
                 token_budget: int | None = None,
                 coalesce: Callable[[], AbstractContextManager[object]] = nullcontext,
                 prefill_overhead: float | None = PREFILL_OVERHEAD,
                 clock: Callable[[], float] = time.thread_time) -> None:
        self.model = model
        self.token_bytes = token_bytes
        self.scheduler: SlotScheduler[Job] = SlotScheduler(slots, mode)
        # tokens one step runs at most: every decoding sequence's next token, then prompt
        # tokens (default: a full batch of decodes, so no step is longer than that one)
        self.token_budget = slots if token_budget is None else token_budget
        if self.token_budget < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1, got {token_budget}")
        # continuous mode: a step with prompt tokens beside decode rows costs at most
        # 1 + prefill_overhead times what its decode rows cost alone (None: the budget only)
        if prefill_overhead is not None and not prefill_overhead >= 0:
            raise ValueError(f"max_prefill_overhead must be >= 0, got {prefill_overhead}")
        self.prefill_overhead = prefill_overhead
        self.cost = StepCost()
        self.clock = clock
        # NURSERY_LLM_TRACE=PATH: a line per step appended to PATH.<pid> (a debugging aid,
        # bench/README.md): its start, wall and CPU seconds, the forward pass's wall and
        # clock seconds, decode rows, prompt tokens, cache positions read, the prefill cap
        self.trace: TextIO | None = None
        self._pass = (0.0, 0.0)
        if os.environ.get("NURSERY_LLM_TRACE"):
            self.trace = open(f"{os.environ['NURSERY_LLM_TRACE']}.{os.getpid()}", "a",  # noqa: SIM115
                              buffering=1)
        self.coalesce = coalesce
        self.eos_ids = frozenset(eos_ids)
        self.name = name
        self.observe = observe
        self._rng = np.random.default_rng(seed)  # for requests without a seed
        self._inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._running: dict[Job, _Sequence] = {}
        self._closed = False
        self._thread: threading.Thread | None = None
        self.outcomes = {"stop": 0, "length": 0, "cancelled": 0, "error": 0}
        self.steps = 0

    # -- the thread -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-decode", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """From any thread: the job waits for a slot."""
        self._inbox.put(job)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread; whatever has not finished gets a final error chunk."""
        self._closed = True
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            self._take(block=False)
            for job in [*self.scheduler.waiting, *self.scheduler.active]:
                self._end(job, "error", "the model is unloading")
            if self.trace is not None:
                self.trace.close()
                self.trace = None

    def _run(self) -> None:
        while not self._closed:
            self._take(block=self.scheduler.idle)
            if self._closed:
                return
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - a failing step costs its sequences only
                log.exception("%s: decode step failed", self.name)
                for job in list(self.scheduler.active):
                    self._end(job, "error", f"generation failed: {exc!r}")

    def _take(self, block: bool) -> None:
        try:
            job = self._inbox.get() if block else self._inbox.get_nowait()
            while True:
                if job is not None:
                    self.scheduler.submit(job)
                job = self._inbox.get_nowait()
        except queue.Empty:
            pass

    # -- one step ---------------------------------------------------------------------------

    def pending(self) -> None:
        """Take what ``submit`` queued (the thread does this before each step)."""
        self._take(block=False)

    def step(self) -> None:
        trace = self.trace
        if trace is not None:
            began, cpu = time.perf_counter(), time.thread_time()
        self.steps += 1
        with self.coalesce():
            for job in [*self.scheduler.waiting, *self.scheduler.active]:
                if job.cancelled():
                    self._end(job, "cancelled")
            decoding = sorted((s for s in self._running.values() if s.decoding),
                              key=lambda s: s.slot)
            for job, slot in self.scheduler.admit():
                if job.prompt:
                    self._sequence(job, slot)
                else:  # nothing to attend to: it cannot start
                    self._end(job, "error", "a prompt must have at least one token")
        prefilling = [s for s in self._running.values() if not s.decoding]  # admission order
        reads = sum(len(s.job.prompt) + len(s.generated) for s in decoding)
        cap = None
        if self.prefill_overhead is not None and self.scheduler.mode == "continuous":
            cap = prefill_cap(self.cost, len(decoding), reads, self.prefill_overhead)
        plan = plan_prefill(self.token_budget, len(decoding),
                            [len(s.job.prompt) - s.fed for s in prefilling], cap)
        chunks = [(s, n) for s, n in zip(prefilling, plan, strict=True) if n]
        if decoding or chunks:
            with self.coalesce():  # what this step sends, sent together
                self._forward(decoding, chunks)
        if self.observe is not None:
            self.observe(self)
        if trace is not None:
            trace.write(f"{began:.6f} {time.perf_counter() - began:.6f} "
                        f"{time.thread_time() - cpu:.6f} {self._pass[0]:.6f} {self._pass[1]:.6f} "
                        f"{len(decoding)} {sum(n for _, n in chunks)} {reads} "
                        f"{-1 if cap is None else cap}\n")
            self._pass = (0.0, 0.0)

    @staticmethod
    def _piece(seq: _Sequence, n: int) -> tuple[int, Sequence[int], int, int]:
        return seq.slot, seq.job.prompt[seq.fed:seq.fed + n], seq.job.adapter, seq.fed

    def _forward(self, decoding: list[_Sequence], chunks: list[tuple[_Sequence, int]]) -> None:
        pieces = [self._piece(s, n) for s, n in chunks]
        try:
            began, wall = self.clock(), time.perf_counter()
            decoded, prefilled = self.model.step(
                [s.slot for s in decoding], [s.last for s in decoding],
                [s.job.adapter for s in decoding], pieces)
            self._pass = (time.perf_counter() - wall, self.clock() - began)
            # what the pass cost, for the prefill cap: its rows and the cache positions its
            # decode rows read (a chunk's own attention is left in the per-row part)
            self.cost.observe(len(decoding) + sum(n for s, n in chunks),
                              sum(len(s.job.prompt) + len(s.generated) for s in decoding),
                              self.clock() - began)
            rows: list[np.ndarray | None] = [*decoded, *prefilled]
        except Exception:  # noqa: BLE001 - find whose rows failed: they alone pay for it
            log.exception("%s: decode step failed; running its parts apart", self.name)
            rows = self._apart(decoding, chunks)
        for (seq, n), row in zip(chunks, rows[len(decoding):], strict=True):
            if row is not None:
                seq.fed += n
        for seq, row in zip([*decoding, *(s for s, _ in chunks)], rows, strict=True):
            if row is not None and seq.decoding:  # a prompt's last chunk gives its first token
                self._advance(seq, seq.sampler.next_token(row, seq.generated))

    def _sequence(self, job: Job, slot: int) -> _Sequence:
        seed = job.sampling.seed
        rng = np.random.default_rng(seed) if seed is not None else \
            np.random.default_rng(self._rng.integers(2**63))
        seq = _Sequence(job, slot, Sampler(job.sampling, rng, job.bad_words),
                        TextStream(self.token_bytes, job.stop))
        self._running[job] = seq
        return seq

    def _apart(self, decoding: list[_Sequence], chunks: list[tuple[_Sequence, int]]
               ) -> list[np.ndarray | None]:
        """A failed step again, the decode rows together and each prompt chunk alone (lengths
        move only when a pass completes, so nothing is fed twice); a part that fails again
        ends its sequences with the error."""
        rows: list[np.ndarray | None] = []
        try:
            if decoding:
                rows += list(self.model.step([s.slot for s in decoding],
                                             [s.last for s in decoding],
                                             [s.job.adapter for s in decoding])[0])
        except Exception as exc:  # noqa: BLE001 - these sequences' failure only
            rows += [None] * len(decoding)
            for seq in decoding:
                self._end(seq.job, "error", f"generation failed: {exc!r}")
        for seq, n in chunks:
            try:
                rows.append(self.model.step((), (), None, [self._piece(seq, n)])[1][0])
            except Exception as exc:  # noqa: BLE001 - this sequence's failure only
                rows.append(None)
                self._end(seq.job, "error", f"generation failed: {exc!r}")
        return rows

    def _advance(self, seq: _Sequence, token: int) -> None:
        seq.generated.append(token)
        seq.last = token
        job = seq.job
        if token in self.eos_ids:
            self._end(job, "stop", tokens=1)
            return
        text, stopped = seq.stream.push(token)
        if stopped:
            self._end(job, "stop", tokens=1, text=text)
        elif len(seq.generated) >= job.max_tokens:
            self._end(job, "length", tokens=1, text=text)
        else:
            try:
                job.emit(Chunk(text, 1))
            except Exception as exc:  # noqa: BLE001 - a sender that refuses ends its job only
                self._end(job, "error", f"a response could not be sent: {exc!r}")

    def _end(self, job: Job, finish: str, error: str | None = None, tokens: int = 0,
             text: str = "") -> None:
        seq = self._running.pop(job, None)
        self.scheduler.cancel(job)
        if seq is not None and finish in ("stop", "length"):
            text += seq.stream.finish()
        self.outcomes[finish] += 1
        try:
            job.emit(Chunk(text, tokens, True, finish, error))
        except Exception:  # noqa: BLE001 - a sender that refuses costs this job only
            log.exception("%s: a final response could not be sent", self.name)

    @property
    def active(self) -> int:
        return len(self.scheduler.active)

    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting)
