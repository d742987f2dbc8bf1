"""An ensemble's step graph, validated once at load, and the pure bookkeeping of one request
flowing through it (no trio, no I/O).

A step is ready as soon as every ensemble tensor it reads exists; the EnsembleScheduler actor
(``nursery/actors/ensemble.py``) starts ready steps, reports each finished step's outputs
here, and answers when every ensemble output exists and no step is running.

An *optional* ensemble input that a request leaves out exists all the same, as an empty
placeholder (Triton's ensemble scheduler does this): the steps that read it still run, and
their requests simply omit that input (:meth:`EnsembleStep.request_inputs`). When the step's
model requires the input, that model refuses the request with its own error, which fails the
ensemble request; the ensemble configuration is not checked for it, as in Triton.

As in Triton's ensemble scheduler, a request runs only the steps its requested outputs need
(:meth:`EnsemblePlan.needed`: the steps that write them and, in turn, those that write what
those read); the others are pruned. A step that answers without one of its outputs still
"writes" that tensor, as absent: a step reading it gets no such input (fine when that input
is optional, the step's own error otherwise), and the ensemble's answer leaves it out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TypeVar

from nursery.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    model_name: str
    model_version: int  # -1: the latest ready version
    input_map: Mapping[str, str]  # the step model's input -> ensemble tensor
    output_map: Mapping[str, str]  # the step model's output -> ensemble tensor
    # filled in once the step's model is loaded (EnsemblePlan.shaped): whether it batches
    # (None: not known, tensors pass unchanged) and its inputs' configured dims
    batching: bool | None = None
    input_dims: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def version_str(self) -> str:
        return "" if self.model_version < 0 else str(self.model_version)

    def request_inputs(self, tensors: Mapping[str, T | None]) -> dict[str, T]:
        """What the step's request carries, by its model's input names: every ensemble tensor
        it reads that has a value in ``tensors``; one without (an optional ensemble input the
        request left out: missing, or ``None`` as :class:`IterFlow` keeps it) is omitted."""
        out: dict[str, T] = {}
        for model_input, tensor in self.input_map.items():
            value = tensors.get(tensor)
            if value is not None:
                out[model_input] = value
        return out


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[EnsembleStep, ...]
    optional_inputs: frozenset[str] = frozenset()  # inputs a request may leave out
    batching: bool = False  # the ensemble's own max_batch_size > 0
    # max_inflight_requests: requests each step may have in flight across all the
    # ensemble's requests (0: no limit)
    max_inflight: int = 0
    # outputs' configured shapes (the reshape where one is given, else the dims)
    output_dims: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # inputs and outputs with a `reshape`: name -> (the shape a tensor has, the shape it takes)
    # (an input's request shape becomes its reshape; an output's answer takes its dims again)
    input_reshape: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] = \
        field(default_factory=dict)
    output_reshape: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] = \
        field(default_factory=dict)
    # with --model-namespacing, the ensemble's own namespace: its steps' models are looked up
    # there first (None: by name alone)
    namespace: str | None = None

    @staticmethod
    def build(name: str, inputs: Iterable[str], outputs: Iterable[str],
              steps: Iterable[EnsembleStep], optional_inputs: Iterable[str] = (),
              max_inflight: int = 0) -> EnsemblePlan:
        """Check the graph: every tensor a step reads exists (an ensemble input or some
        step's output), no tensor is written twice, every ensemble output is written, no
        cycle, no step unreachable. Errors name the ensemble, the step and the tensor."""
        plan = EnsemblePlan(name, tuple(inputs), tuple(outputs), tuple(steps),
                            frozenset(optional_inputs), max_inflight=max_inflight)
        where = f"ensemble '{name}'"
        unknown = sorted(plan.optional_inputs - set(plan.inputs))
        if unknown:
            raise ConfigError(f"{where}: optional input '{unknown[0]}' is not an input")
        if not plan.steps:
            raise ConfigError(f"{where} must have at least one step")
        producer: dict[str, int] = {}
        for i, step in enumerate(plan.steps):
            label = f"{where} step {i} (model '{step.model_name}')"
            if not step.model_name:
                raise ConfigError(f"{where} step {i} must specify 'model_name'")
            if not step.input_map:
                raise ConfigError(f"{label} must map at least one input ('input_map')")
            if not step.output_map:
                raise ConfigError(f"{label} must map at least one output ('output_map')")
            for tensor in step.output_map.values():
                if tensor in plan.inputs:
                    raise ConfigError(
                        f"{label} writes ensemble tensor '{tensor}', which is an input of the "
                        "ensemble")
                if tensor in producer:
                    raise ConfigError(
                        f"{label} writes ensemble tensor '{tensor}', which step {producer[tensor]} "
                        "already writes; an ensemble tensor has exactly one producer")
                producer[tensor] = i
        for i, step in enumerate(plan.steps):
            for model_input, tensor in step.input_map.items():
                if tensor not in plan.inputs and tensor not in producer:
                    raise ConfigError(
                        f"{where} step {i} (model '{step.model_name}') input '{model_input}' "
                        f"reads ensemble tensor '{tensor}', which is neither an ensemble input "
                        "nor written by any step")
        for out in plan.outputs:
            if out not in producer:
                raise ConfigError(f"{where}: output '{out}' is not written by any step")
        # every step must become ready starting from the ensemble inputs alone
        flow = plan.start()
        while True:
            ready = flow.take_ready()
            if not ready:
                break
            for i in ready:
                flow.finished(i)
        stuck = [i for i in range(len(plan.steps)) if i not in flow.done]
        if stuck:
            names = ", ".join(f"step {i} (model '{plan.steps[i].model_name}')" for i in stuck)
            raise ConfigError(
                f"{where} has a cycle: {names} wait for each other's outputs and can never run")
        return plan

    def start(self, outputs: Iterable[str] | None = None) -> Flow:
        """One request's bookkeeping; with ``outputs``, only the steps they need run."""
        return Flow(self, None if outputs is None else self.needed(outputs))

    def needed(self, outputs: Iterable[str]) -> frozenset[int]:
        """The steps a request for ``outputs`` runs: those writing them and, transitively,
        those writing what those read (Triton prunes every other step)."""
        producer = {t: i for i, step in enumerate(self.steps) for t in step.output_map.values()}
        needed: set[int] = set()
        todo = [producer[o] for o in outputs if o in producer]
        while todo:
            i = todo.pop()
            if i not in needed:
                needed.add(i)
                todo.extend(producer[t] for t in self.steps[i].input_map.values()
                            if t in producer)
        return frozenset(needed)

    def models(self) -> set[str]:
        return {s.model_name for s in self.steps}

    def shaped(self, batching: bool, output_dims: Mapping[str, tuple[int, ...]],
               steps: Sequence[tuple[bool, Mapping[str, tuple[int, ...]]]],
               input_reshape: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
               output_reshape: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
               ) -> EnsemblePlan:
        """The plan with what tensors need between batching and non-batching models: the
        ensemble's own batching and output shapes, and for each step whether its model batches
        and its inputs' dims (in step order); and the ensemble's own input and output reshapes
        (name -> (from, to))."""
        return replace(self, batching=batching, output_dims=MappingProxyType(dict(output_dims)),
                       input_reshape=MappingProxyType(dict(input_reshape or {})),
                       output_reshape=MappingProxyType(dict(output_reshape or {})),
                       steps=tuple(replace(step, batching=b, input_dims=MappingProxyType(dict(d)))
                                   for step, (b, d) in zip(self.steps, steps, strict=True)))

    def input_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape with which request input ``name`` becomes an ensemble tensor: its
        `reshape` where the ensemble's input has one (Triton's request normalization), the
        batch dim kept."""
        pair = self.input_reshape.get(name)
        return shape if pair is None else convert_dims(shape, pair[0], pair[1], self.batching)

    def answer_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of ensemble output ``name`` in the answer: :meth:`output_shape`'s, then
        back from the output's `reshape` to its dims where it has one (as Triton's response
        reports an output of a model with a reshape)."""
        shape = self.output_shape(name, shape)
        pair = self.output_reshape.get(name)
        return shape if pair is None else convert_dims(shape, pair[0], pair[1], self.batching)

    def _batch_size(self, tensor: str, shape: Sequence[int]) -> int:
        """Triton's batch size of an ensemble tensor: its first dim when the model that wrote
        it (or the ensemble, for an ensemble input) batches, else 0."""
        batching: bool | None = self.batching
        for step in self.steps:
            if tensor in step.output_map.values():
                batching = step.batching
                break
        return int(shape[0]) if batching and shape else 0

    def step_input_shape(self, index: int, model_input: str,
                         shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape with which an ensemble tensor reaches input ``model_input`` of step
        ``index``: a batch dim of 1 added or taken away where a batching and a non-batching
        model meet (Triton's ReshapeTensorDims)."""
        step = self.steps[index]
        dims = step.input_dims.get(model_input)
        if step.batching is None or dims is None:
            return shape
        tensor = step.input_map[model_input]
        return reshape_dims(dims, step.batching, self._batch_size(tensor, shape), shape)

    def output_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of ensemble output ``name`` in the ensemble's answer (the same rule)."""
        dims = self.output_dims.get(name)
        if dims is None:
            return shape
        return reshape_dims(dims, self.batching, self._batch_size(name, shape), shape)


def _dims_match(config_dims: Sequence[int], dims: Sequence[int]) -> bool:
    return len(config_dims) == len(dims) and all(
        c == d or c == -1 or d == -1 for c, d in zip(config_dims, dims, strict=True))


def convert_dims(shape: tuple[int, ...], from_dims: Sequence[int], to_dims: Sequence[int],
                 batching: bool) -> tuple[int, ...]:
    """``shape`` (the batch dim first when ``batching``) from a configured shape to another
    (dims to reshape, or back), Triton's way: the values of its variable (-1) dims fill the
    other's variable dims in order. A shape that does not fit ``from_dims``, or whose element
    count would change, is returned as it is."""
    offset = 1 if batching and shape else 0
    body = shape[offset:]
    if len(body) != len(from_dims):
        return shape
    values = [d for d, c in zip(body, from_dims, strict=True) if c == -1]
    if sum(1 for c in to_dims if c == -1) != len(values):
        return shape
    filled = iter(values)
    out = (*shape[:offset], *(next(filled) if c == -1 else c for c in to_dims))
    if math.prod(out) != math.prod(shape):
        return shape
    return out


def reshape_dims(config_dims: Sequence[int], config_batching: bool, tensor_batch: int,
                 dims: tuple[int, ...]) -> tuple[int, ...]:
    """Triton's rule when a tensor made by a batching model meets a non-batching one or the
    reverse (and only then): a batching model gets a batch dim of 1 prepended when the shape
    already is its configured dims; a non-batching model gets a batch of 1 stripped when the
    full shape does not fit its dims. Everything else passes unchanged."""
    if config_batching != (tensor_batch != 0):
        if config_batching:
            if _dims_match(config_dims, dims):
                return (1, *dims)
        elif not _dims_match(config_dims, dims) and tensor_batch == 1:
            return dims[1:]
    return dims


class Flow:
    """One request in flight: which tensors exist, which steps ran, which are running.
    ``steps``: the steps this request runs (None: all)."""

    __slots__ = ("plan", "steps", "available", "started", "done")

    def __init__(self, plan: EnsemblePlan, steps: frozenset[int] | None = None) -> None:
        self.plan = plan
        self.steps = frozenset(range(len(plan.steps))) if steps is None else steps
        self.available: set[str] = set(plan.inputs)
        self.started: set[int] = set()
        self.done: set[int] = set()

    def take_ready(self) -> list[int]:
        """Steps whose inputs all exist and that have not started; they count as started."""
        ready = [i for i, step in enumerate(self.plan.steps)
                 if i in self.steps and i not in self.started
                 and all(t in self.available for t in step.input_map.values())]
        self.started.update(ready)
        return ready

    def finished(self, index: int) -> None:
        self.done.add(index)
        self.available.update(self.plan.steps[index].output_map.values())

    def complete(self) -> bool:
        """Every step of the request ran (so every output it asked for was written)."""
        return len(self.done) == len(self.steps)


class IterFlow:
    """One request in flight through a *decoupled* ensemble, kept as Triton's ensemble
    scheduler keeps it: every ensemble tensor holds its values by *iteration* (the ensemble
    inputs are iteration 0; each response of the step that writes a tensor adds that tensor's
    next iteration), a step runs once for every iteration ``k`` at which all the tensors it
    reads exist, and the ensemble answers once for every iteration at which all its outputs
    exist. A step run at iteration ``k`` that answers once (a non-decoupled model) writes its
    outputs at ``k``, so a later step pairs them with the other tensors of ``k`` even when runs
    finish out of order (Triton numbers them in the order they finish, which is the same
    whenever the model keeps its responses in order). A decoupled step that answers three
    times thus runs the steps after it three times, and the ensemble answers three times; a
    step that reads a tensor from before the decoupled step and one from after it is refused
    at load (``nursery/config/ensemble_check.py``), as in Triton.

    :meth:`add_inputs` and :meth:`add_outputs` return the (tensor, iteration) pairs they
    added; :meth:`ready` turns them into (step, iteration) pairs to run, :meth:`answers` into
    iterations whose ensemble outputs are complete. Values are opaque here (None stands for
    an absent tensor). With ``outputs`` (the request's), only the steps they need run and
    only they make an answer complete."""

    __slots__ = ("plan", "outputs", "values", "counts", "readers")

    def __init__(self, plan: EnsemblePlan, outputs: Iterable[str] | None = None) -> None:
        self.plan = plan
        self.outputs = plan.outputs if outputs is None else tuple(outputs)
        needed = plan.needed(self.outputs)
        self.values: dict[str, dict[int, object]] = {}
        self.counts: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        for i, step in enumerate(plan.steps):
            if i not in needed:
                continue
            for tensor in dict.fromkeys(step.input_map.values()):
                self.readers.setdefault(tensor, []).append(i)

    def _add(self, tensor: str, value: object, at: int | None = None) -> tuple[str, int]:
        iteration = self.counts.get(tensor, 0) if at is None else at
        self.counts[tensor] = max(self.counts.get(tensor, 0), iteration + 1)
        self.values.setdefault(tensor, {})[iteration] = value
        return tensor, iteration

    def add_inputs(self, inputs: Mapping[str, object]) -> list[tuple[str, int]]:
        """The request's inputs at iteration 0; an optional input it leaves out is there too,
        as ``None`` (the steps that read it run without it)."""
        given = [self._add(name, value) for name, value in inputs.items()]
        absent = [self._add(name, None) for name in self.plan.inputs
                  if name in self.plan.optional_inputs and name not in inputs]
        return given + absent

    def add_outputs(self, index: int, outputs: Mapping[str, object],
                    at: int | None = None) -> list[tuple[str, int]]:
        """One response of step ``index``: its model's outputs by the model's names, at
        iteration ``at`` (the only response of a run at ``at``) or at each tensor's next one
        (one of a stream of responses)."""
        output_map = self.plan.steps[index].output_map
        return [self._add(output_map[name], value, at) for name, value in outputs.items()
                if name in output_map]

    def ready(self, updates: Iterable[tuple[str, int]]) -> list[tuple[int, int]]:
        found: set[tuple[int, int]] = set()
        for tensor, iteration in updates:
            for i in self.readers.get(tensor, ()):
                if all(iteration in self.values.get(t, {})
                       for t in self.plan.steps[i].input_map.values()):
                    found.add((i, iteration))
        return sorted(found, key=lambda p: (p[1], p[0]))

    def answers(self, updates: Iterable[tuple[str, int]]) -> list[int]:
        outputs = self.outputs
        iterations = {it for tensor, it in updates if tensor in outputs}
        return sorted(it for it in iterations
                      if all(it in self.values.get(o, {}) for o in outputs))

    def inputs(self, index: int, iteration: int) -> dict[str, object]:
        """What step ``index`` reads at ``iteration``, by its model's input names (an
        optional ensemble input the request left out is omitted)."""
        step = self.plan.steps[index]
        return step.request_inputs({tensor: self.values[tensor][iteration]
                                    for tensor in step.input_map.values()})

    def output(self, name: str, iteration: int) -> object:
        return self.values[name][iteration]
