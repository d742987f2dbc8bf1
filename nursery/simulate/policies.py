"""Policies by name or import path, built from a model's scheduling settings.

Built in (``--policy NAME``):

- ``server``: what the server runs for this model: ``dynamic`` when its config.pbtxt has
  ``dynamic_batching``, else ``fifo`` (the default);
- ``fifo``: the default scheduler (``FifoPolicy`` with the server's slots and queue bound);
- ``dynamic``: Triton's dynamic batcher (``DynamicBatchPolicy``);
- ``adaptive``: ``AdaptiveDelayPolicy``, the queue delay following the arrival rate;
- ``edf``: ``EarliestDeadlinePolicy``, nearest deadline first.

Anything else is an import path ``package.module:Name``. ``Name`` is a class with a
``from_config(batch, instances)`` class method, or any callable ``Name(batch, instances)``,
returning a policy (see ``nursery.scheduling.decisions.SchedulingPolicy``). ``batch`` is the
:class:`~nursery.scheduling.batch_policy.BatchConfig` read from the model's
``dynamic_batching`` block (Triton's defaults when the block is absent), ``instances`` the
number of model instances. A policy's ``slots`` attribute, when it has one, says how many
batches an instance may hold at once (default 1), as ``FifoPolicy``'s does in the server.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from nursery.actors.model_manager import DEFAULT_SCHEDULER_SLOTS, MAX_QUEUE
from nursery.scheduling.adaptive_delay import AdaptiveDelayPolicy
from nursery.scheduling.batch_policy import BatchConfig, DynamicBatchPolicy
from nursery.scheduling.edf import EarliestDeadlinePolicy
from nursery.scheduling.fifo import FifoPolicy

Factory = Callable[[BatchConfig, int], Any]


def _fifo(batch: BatchConfig, instances: int) -> Any:
    return FifoPolicy(DEFAULT_SCHEDULER_SLOTS, MAX_QUEUE)


BUILTIN: dict[str, Factory] = {
    "fifo": _fifo,
    "dynamic": lambda batch, instances: DynamicBatchPolicy(batch),
    "adaptive": AdaptiveDelayPolicy.from_config,
    "edf": EarliestDeadlinePolicy.from_config,
}


def resolve(spec: str, *, has_dynamic_batching: bool = True) -> Factory:
    """The factory for a policy name or ``module:Name`` import path."""
    if spec == "server":
        spec = "dynamic" if has_dynamic_batching else "fifo"
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
          has_dynamic_batching: bool = True) -> tuple[Any, int]:
    """A fresh policy and the slots each instance offers it."""
    policy = resolve(spec, has_dynamic_batching=has_dynamic_batching)(batch, instances)
    for method in ("arrive", "instance_ready", "poll"):
        if not callable(getattr(policy, method, None)):
            raise ValueError(f"policy '{spec}' has no {method}() method: see "
                             "nursery/scheduling/decisions.py for what a policy implements")
    slots = getattr(policy, "slots", 1)
    return policy, slots if isinstance(slots, int) and slots > 0 else 1
