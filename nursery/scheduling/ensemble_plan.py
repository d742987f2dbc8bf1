"""An ensemble's step graph, validated once at load, and the pure bookkeeping of one request
flowing through it (no trio, no I/O).

A step is ready as soon as every ensemble tensor it reads exists; the EnsembleScheduler actor
(``nursery/actors/ensemble.py``) starts ready steps, reports each finished step's outputs
here, and answers when every ensemble output exists and no step is running.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nursery.errors import ConfigError


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    model_name: str
    model_version: int  # -1: the latest ready version
    input_map: Mapping[str, str]  # the step model's input -> ensemble tensor
    output_map: Mapping[str, str]  # the step model's output -> ensemble tensor

    @property
    def version_str(self) -> str:
        return "" if self.model_version < 0 else str(self.model_version)


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[EnsembleStep, ...]

    @staticmethod
    def build(name: str, inputs: Iterable[str], outputs: Iterable[str],
              steps: Iterable[EnsembleStep]) -> EnsemblePlan:
        """Check the graph: every tensor a step reads exists (an ensemble input or some
        step's output), no tensor is written twice, every ensemble output is written, no
        cycle, no step unreachable. Errors name the ensemble, the step and the tensor."""
        plan = EnsemblePlan(name, tuple(inputs), tuple(outputs), tuple(steps))
        where = f"ensemble '{name}'"
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

    def start(self) -> Flow:
        return Flow(self)

    def models(self) -> set[str]:
        return {s.model_name for s in self.steps}


class Flow:
    """One request in flight: which tensors exist, which steps ran, which are running."""

    __slots__ = ("plan", "available", "started", "done")

    def __init__(self, plan: EnsemblePlan) -> None:
        self.plan = plan
        self.available: set[str] = set(plan.inputs)
        self.started: set[int] = set()
        self.done: set[int] = set()

    def take_ready(self) -> list[int]:
        """Steps whose inputs all exist and that have not started; they count as started."""
        ready = [i for i, step in enumerate(self.plan.steps)
                 if i not in self.started
                 and all(t in self.available for t in step.input_map.values())]
        self.started.update(ready)
        return ready

    def finished(self, index: int) -> None:
        self.done.add(index)
        self.available.update(self.plan.steps[index].output_map.values())

    def complete(self) -> bool:
        """Every step ran (so every ensemble output exists)."""
        return len(self.done) == len(self.plan.steps)
