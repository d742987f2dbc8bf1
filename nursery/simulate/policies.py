"""Policies by name or import path, built from a model's scheduling settings.

Built in (``--policy NAME``):

- ``server``: what the server runs for this model: ``latency`` when its config.pbtxt selects
  it (``nursery.batcher``), ``dynamic`` when it has ``dynamic_batching``, else ``fifo`` (the
  default);
- ``fifo``: the default scheduler (``FifoPolicy`` with the server's slots and queue bound);
- ``dynamic``: Triton's dynamic batcher (``DynamicBatchPolicy``);
- ``adaptive``: ``AdaptiveDelayPolicy``, the queue delay following the arrival rate;
- ``edf``: ``EarliestDeadlinePolicy``, nearest deadline first;
- ``latency``: ``LatencyObjectivePolicy``, nursery's latency-objective batcher, holding the
  objective of the model's ``nursery.latency_objective_ms`` parameter or of
  ``--latency-objective-ms``;
- ``sequence``: the sequence batcher (``SequencePolicy``) from the model's
  ``sequence_batching`` block, where this version of nursery has it.

Anything else is an import path ``package.module:Name``. ``Name`` is a class with a
``from_config(batch, instances)`` class method, or any callable ``Name(batch, instances)``,
returning a policy (see ``nursery.scheduling.decisions.SchedulingPolicy``). ``batch`` is the
:class:`~nursery.scheduling.batch_policy.BatchConfig` read from the model's
``dynamic_batching`` block (Triton's defaults when the block is absent), ``instances`` the
number of model instances; a factory that also takes a keyword ``model`` gets the whole
``ModelConfig`` (None without ``--model``), e.g. to read ``sequence_batching``. A policy's
``slots`` attribute, when it has one, says how many batches an instance may hold at once
(default 1), as ``FifoPolicy``'s does in the server.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from nursery.scheduling.adaptive_delay import AdaptiveDelayPolicy
from nursery.scheduling.batch_policy import BatchConfig, DynamicBatchPolicy
from nursery.scheduling.edf import EarliestDeadlinePolicy
from nursery.scheduling.fifo import FifoPolicy
from nursery.scheduling.latency_objective import LatencyObjectivePolicy, Objective
from nursery.scheduling.selection import DEFAULT_SCHEDULER_SLOTS, MAX_QUEUE

# (batch: BatchConfig, instances: int) -> a policy; some take a keyword ``model`` too, which
# build() finds out by inspecting them
Factory = Callable[..., Any]


def _fifo(batch: BatchConfig, instances: int) -> Any:
    return FifoPolicy(DEFAULT_SCHEDULER_SLOTS, MAX_QUEUE)


def _sequence(batch: BatchConfig, instances: int, *, model: Any = None) -> Any:
    try:
        module = importlib.import_module("nursery.scheduling.sequence_policy")
    except ImportError:
        raise ValueError("policy 'sequence': this version of nursery has no sequence "
                         "batcher") from None
    sequence = getattr(model, "sequence", None)
    if sequence is None:
        raise ValueError("policy 'sequence' needs --model NAME whose config.pbtxt has "
                         "sequence_batching")
    return module.SequencePolicy(sequence.schedule, instances, model=model.name)


def _latency(batch: BatchConfig, instances: int, *, model: Any = None,
             objective: Objective | None = None) -> Any:
    objective = objective or getattr(model, "objective", None)
    if objective is None:
        raise ValueError("policy 'latency' needs an objective: --latency-objective-ms N, or "
                         "--model NAME whose config.pbtxt sets nursery.latency_objective_ms")
    return LatencyObjectivePolicy(batch, objective, model=getattr(model, "name", ""))


BUILTIN: dict[str, Factory] = {
    "fifo": _fifo,
    "dynamic": lambda batch, instances: DynamicBatchPolicy(batch),
    "adaptive": AdaptiveDelayPolicy.from_config,
    "edf": EarliestDeadlinePolicy.from_config,
    "sequence": _sequence,
    "latency": _latency,
}


def server_policy(model: Any) -> str:
    """The name of the policy the server runs for a model's config (fifo without one)."""
    if model is None:
        return "fifo"
    if getattr(model, "scheduler", "") == "sequence":
        return "sequence"
    if getattr(model, "objective", None) is not None:
        return "latency"
    return "dynamic" if model.batching is not None else "fifo"


def resolve(spec: str, *, model: Any = None) -> Factory:
    """The factory for a policy name or ``module:Name`` import path."""
    if spec == "server":
        spec = server_policy(model)
    if spec in BUILTIN:
        return BUILTIN[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"unknown policy '{spec}': use one of server, {', '.join(BUILTIN)} "
                         "or an import path package.module:Name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"policy '{spec}': cannot import '{module_name}': {exc}") from None
    target = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"policy '{spec}': '{module_name}' has no '{attr}'") from None
    factory = getattr(target, "from_config", target)
    if not callable(factory):
        raise ValueError(f"policy '{spec}' is not a class or a callable")
    return factory  # type: ignore[no-any-return]


def build(spec: str, batch: BatchConfig, instances: int, *,
          model: Any = None, objective: Objective | None = None) -> tuple[Any, int]:
    """A fresh policy and the slots each instance offers it (``objective``: for the policies
    that take one, overriding the model's)."""
    factory = resolve(spec, model=model)
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        parameters = {}  # type: ignore[assignment]
    keywords: dict[str, Any] = {}
    if "model" in parameters:
        keywords["model"] = model
    if "objective" in parameters and (objective is not None or "model" not in parameters):
        keywords["objective"] = objective
    policy = factory(batch, instances, **keywords)
    for method in ("arrive", "instance_ready", "poll"):
        if not callable(getattr(policy, method, None)):
            raise ValueError(f"policy '{spec}' has no {method}() method: see "
                             "nursery/scheduling/decisions.py for what a policy implements")
    slots = getattr(policy, "slots", 1)
    return policy, slots if isinstance(slots, int) and slots > 0 else 1
