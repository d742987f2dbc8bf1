"""The configuration space ``analyze`` searches, and a candidate written as a config.pbtxt.

A candidate is what the scheduling of a model can change without touching the model: the
instance count, ``max_batch_size`` (up to the model's own, which is what its inputs allow),
the scheduler (the default FIFO, Triton's dynamic batcher, or nursery's latency-objective
batcher when there is an objective), and for the dynamic batcher its
``max_queue_delay_microseconds`` and a ``preferred_batch_size``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nursery.config import pbtext
from nursery.config.model import ModelConfig
from nursery.scheduling.batch_policy import BatchConfig
from nursery.scheduling.latency_objective import (
    BATCHER_KEY,
    BATCHER_NAME,
    OBJECTIVE_KEY,
    PERCENTILE_KEY,
    Objective,
)
from nursery.schema import inference as pb

POLICIES = ("fifo", "dynamic", "latency")


@dataclass(frozen=True, order=True)
class Candidate:
    policy: str  # fifo | dynamic | latency
    instances: int
    max_batch_size: int
    max_queue_delay_us: int = 0
    preferred_batch_size: int = 0  # 0: none (Triton then prefers max_batch_size)

    def label(self) -> str:
        parts = [self.policy, f"x{self.instances}", f"mbs {self.max_batch_size}"]
        if self.policy == "dynamic":
            parts.append(f"delay {self.max_queue_delay_us}us")
            if self.preferred_batch_size:
                parts.append(f"pref {self.preferred_batch_size}")
        return " ".join(parts)

    def batch_config(self, model: ModelConfig) -> BatchConfig:
        """The scheduling settings the simulator runs (the model's own priority levels and
        queue policies kept)."""
        base = model.batching or BatchConfig(max_batch_size=self.max_batch_size)
        return dataclasses.replace(
            base, max_batch_size=self.max_batch_size,
            preferred_batch_sizes=(self.preferred_batch_size,) if self.preferred_batch_size else (),
            max_queue_delay_us=self.max_queue_delay_us if self.policy == "dynamic" else 0)


def grid(model: ModelConfig, *, instances: list[int], max_batch_sizes: list[int] | None,
         delays_us: list[int], objective: Objective | None,
         policies: list[str] | None = None) -> list[Candidate]:
    """Every candidate: ``max_batch_sizes`` default to powers of two up to the model's own
    (none above it); a model that does not batch gets FIFO candidates only."""
    wanted = set(policies or POLICIES)
    unknown = wanted - set(POLICIES)
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)}: use {', '.join(POLICIES)}")
    if any(n < 1 for n in instances):
        raise ValueError("instance counts must be at least 1")
    if any(d < 0 for d in delays_us):
        raise ValueError("queue delays must not be negative")
    top = model.max_batch_size
    out: list[Candidate] = []
    if top == 0:
        return [Candidate("fifo", n, 0) for n in sorted(set(instances)) if "fifo" in wanted]
    if max_batch_sizes is None:
        sizes = sorted({top, *(1 << k for k in range(0, 16) if (1 << k) <= top)})
    else:
        bad = [s for s in max_batch_sizes if not 1 <= s <= top]
        if bad:
            raise ValueError(f"max batch sizes {bad} are not between 1 and the model's "
                             f"max_batch_size {top}")
        sizes = sorted(set(max_batch_sizes))
    for n in sorted(set(instances)):
        if "fifo" in wanted:
            out.append(Candidate("fifo", n, top))
        for size in sizes:
            if "dynamic" in wanted:
                for delay in sorted(set(delays_us)):
                    out.append(Candidate("dynamic", n, size, delay))
                    half = size // 2
                    if half >= 2 and delay > 0:  # a smaller preferred size leaves sooner
                        out.append(Candidate("dynamic", n, size, delay, half))
            if "latency" in wanted and objective is not None:
                out.append(Candidate("latency", n, size))
    return out


def config_text(original: str, candidate: Candidate, objective: Objective | None,
                name: str | None = None) -> str:
    """``original`` (a config.pbtxt's text) with the candidate's scheduling: the rest of the
    file (inputs, outputs, backend, other parameters) is kept; ``name`` renames the model."""
    proto = pbtext.parse(original, pb.ModelConfig())
    if name is not None:
        proto.name = name
    if proto.max_batch_size > 0:
        proto.max_batch_size = candidate.max_batch_size
    if proto.instance_group:
        for group in proto.instance_group:
            group.count = candidate.instances
    else:
        proto.instance_group = [pb.ModelInstanceGroup(
            count=candidate.instances,
            kind=pb.ModelInstanceGroupKind.KIND_CPU)]  # type: ignore[arg-type]
    for key in (BATCHER_KEY, OBJECTIVE_KEY, PERCENTILE_KEY):
        proto.parameters.pop(key, None)
    had_batching = pbtext.is_present(proto, pbtext.fields_of(pb.ModelConfig)["dynamic_batching"])
    if candidate.policy == "latency":
        if objective is None:
            raise ValueError("a latency-objective candidate needs an objective")
        proto.parameters[BATCHER_KEY] = pb.ModelParameter(string_value=BATCHER_NAME)
        proto.parameters[OBJECTIVE_KEY] = pb.ModelParameter(
            string_value=f"{objective.latency_s * 1e3:g}")
        proto.parameters[PERCENTILE_KEY] = pb.ModelParameter(
            string_value=f"{objective.percentile:g}")
    if candidate.policy == "dynamic" or (candidate.policy == "latency" and had_batching):
        if not had_batching:
            proto.dynamic_batching = pb.ModelDynamicBatching()
        batching = proto.dynamic_batching
        pbtext.mark_present(batching)
        batching.max_queue_delay_microseconds = (
            candidate.max_queue_delay_us if candidate.policy == "dynamic" else 0)
        batching.preferred_batch_size = (
            [candidate.preferred_batch_size] if candidate.preferred_batch_size else [])
    text = pbtext.dumps(proto)
    if candidate.policy == "fifo" or (candidate.policy == "latency" and not had_batching):
        text = _without_block(text, "dynamic_batching")
    return text


def _without_block(text: str, block: str) -> str:
    """``text`` (as ``pbtext.dumps`` writes it) without the top-level ``block { ... }``."""
    out: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        if not skipping and line.startswith(f"{block} {{"):
            skipping = True
            continue
        if skipping:
            if line.startswith("}"):
                skipping = False
            continue
        out.append(line)
    return "".join(out)
