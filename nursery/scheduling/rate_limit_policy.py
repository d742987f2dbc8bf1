"""The rate limiter's decisions (``--rate-limit execution_count``), pure: no trio, no clock.

Each model instance may list resources in ``instance_group { rate_limiter { resources [...]
priority } }``. An instance runs a batch only once every resource it lists is free, in the
listed count, on its device (or across the server for a ``global`` resource); the resources
are held until the batch ends. How many copies exist, as Triton counts them: with no
``--rate-limit-resource`` flag, the largest count any registered instance asks for; with any,
only what the flags give (``NAME:COUNT`` for every device, ``NAME:COUNT:DEVICE`` for one; the
larger of the two where both apply; a global resource takes the largest count given for its
name), and a resource no flag names has none. An instance whose resources cannot fit can
never run: registering it fails with Triton's message (naming the largest count any instance
of that pool asks for), so the model fails to load instead of deadlocking. So does a resource
that one instance lists as global and another per device.

Who goes next: stride scheduling over the waiting instances. Each instance's *pass* starts at
its ``priority`` (0 counts as 1; a newcomer's on top of where the furthest-behind instance
stands before its next turn) and grows by it every time it is granted, and the waiting
instance with the lowest pass goes first (ties: the lower priority value, then the earlier
request), so an instance with priority 2 gets half the chances of one with priority 1.
Starting at the stride, not at 0, puts the turns of two busy instances with priorities 1 and
2 in Triton's cycle (1, 1, 2, and again) whichever registered or asked first: the priority-1
instance takes both of its turns before the other's, as Triton's limiter gives them
(L0_rate_limiter's cross-model case counts on that phase: its 80 to 44 is 80 to 45 in the
other). An instance may ask
for its next turn while its batch still runs (its next batch is queued): it is granted only
after it releases, and then competes with the others by its pass, so a busy instance is not
passed over because its release reached the limiter before its next request did. An instance
that cannot run yet reserves its resources: no later request may take them, so large
requests are never starved by small ones; requests that touch none of the reserved resources
still run.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

GLOBAL = -1  # the device of global resources


@dataclass(frozen=True, slots=True)
class ResourceNeed:
    name: str
    count: int
    is_global: bool = False


@dataclass(slots=True)
class _Instance:
    device: int
    needs: tuple[ResourceNeed, ...]
    priority: int
    pass_value: float = 0.0
    waiting: int | None = None  # arrival number of its pending request
    running: bool = False


def describe_max_resources(pools: Mapping[tuple[str, int], int]) -> str:
    """The pools as Triton's rate limiter logs them (at --log-verbose 1) when they change."""
    text = "\nMax Resource Map===>\n"
    for device in sorted({d for _, d in pools}):
        text += f"\tDevice: {'GLOBAL' if device == GLOBAL else device}\n"
        for (name, d), count in pools.items():
            if d == device:
                text += f"\t\tResource: {name}\t Count: {count}\n"
    return text


class RateLimitError(ValueError):
    pass


class RateLimitPolicy:
    """Resource pools, registered instances and their requests."""

    def __init__(self, explicit: Mapping[tuple[str, int | None], int] | None = None) -> None:
        # (name, device) -> count; device None = every device (or the global pool)
        self.explicit = dict(explicit or {})
        self.instances: dict[Hashable, _Instance] = {}
        self.in_use: dict[tuple[str, int], int] = {}
        self._arrivals = 0

    # -- pools -----------------------------------------------------------------------------

    @staticmethod
    def _slot(need: ResourceNeed, device: int) -> tuple[str, int]:
        return (need.name, GLOBAL if need.is_global else device)

    def capacity(self, name: str, device: int) -> int:
        if self.explicit:
            return self._explicit_count(name, device)
        return self._largest_need(name, device)

    def _explicit_count(self, name: str, device: int) -> int:
        """Triton's count of a pool once any flag gives counts: the largest that applies,
        none when no flag names the resource."""
        if device == GLOBAL:  # a global pool: any device's count for the name
            counts = [c for (n, _), c in self.explicit.items() if n == name]
        else:
            counts = [c for (n, d), c in self.explicit.items()
                      if n == name and d in (device, None)]
        return max(counts, default=0)

    def _largest_need(self, name: str, device: int,
                      extra: tuple[ResourceNeed, ...] = (), extra_device: int = 0) -> int:
        needs = [(n, i.device) for i in self.instances.values() for n in i.needs]
        needs += [(n, extra_device) for n in extra]
        return max((n.count for n, d in needs if self._slot(n, d) == (name, device)),
                   default=0)

    def max_resources(self) -> dict[tuple[str, int], int]:
        """Every pool a registered instance uses and how many copies it has."""
        slots = {self._slot(n, i.device) for i in self.instances.values() for n in i.needs}
        return {slot: self.capacity(*slot) for slot in sorted(slots)}

    def _fits(self, inst: _Instance) -> bool:
        return all(self.in_use.get(self._slot(n, inst.device), 0) + n.count
                   <= self.capacity(*self._slot(n, inst.device)) for n in inst.needs)

    # -- instances -------------------------------------------------------------------------

    def register(self, key: Hashable, device: int, needs: tuple[ResourceNeed, ...],
                 priority: int) -> None:
        for need in needs:
            if need.count < 0:
                raise RateLimitError(f"resource '{need.name}' asks for a negative count")
        for need in needs:  # Triton's words for both refusals
            if any(n.name == need.name and n.is_global != need.is_global
                   for i in self.instances.values() for n in i.needs):
                raise RateLimitError(
                    f'Resource "{need.name}" is present as both global and device-specific '
                    f"resource in the model configuration.")
        if self.explicit:
            for need in needs:
                name, dev = self._slot(need, device)
                required = self._largest_need(name, dev, needs, device)
                available = self._explicit_count(name, dev)
                if available < required:
                    raise RateLimitError(
                        f'Resource count for "{name}" is limited to {available} which will '
                        f"prevent scheduling of one or more model instances, the minimum "
                        f"required count is {required}")
        # newcomers do not jump the queue: they start where the furthest-behind instance is
        # before its next turn, so instances registered together start together, in any order
        start = min((i.pass_value - i.priority for i in self.instances.values()), default=0.0)
        stride = max(1, priority)
        self.instances[key] = _Instance(device, needs, stride, start + stride)

    def unregister(self, key: Hashable) -> None:
        inst = self.instances.pop(key, None)
        if inst is not None and inst.running:
            self._free(inst)

    # -- requests --------------------------------------------------------------------------

    def request(self, key: Hashable) -> None:
        """``key`` has a batch to run: it waits for a grant (after its release, when its
        batch before still runs)."""
        inst = self.instances[key]
        if inst.waiting is None:
            inst.waiting = self._arrivals
            self._arrivals += 1

    def withdraw(self, key: Hashable) -> None:
        """The instance no longer wants to run (its request was abandoned)."""
        inst = self.instances.get(key)
        if inst is not None:
            inst.waiting = None

    def release(self, key: Hashable) -> None:
        """The instance's batch ended: its resources are free."""
        inst = self.instances.get(key)
        if inst is not None and inst.running:
            self._free(inst)
            inst.running = False

    def _free(self, inst: _Instance) -> None:
        for need in inst.needs:
            slot = self._slot(need, inst.device)
            self.in_use[slot] = self.in_use.get(slot, 0) - need.count

    def grants(self) -> list[Hashable]:
        """The waiting instances that may run now, each now holding its resources."""
        waiting = sorted((i.pass_value, i.priority, i.waiting, k)
                         for k, i in self.instances.items()
                         if i.waiting is not None and not i.running)
        reserved: set[tuple[str, int]] = set()
        out: list[Hashable] = []
        for _, _, _, key in waiting:
            inst = self.instances[key]
            slots = {self._slot(n, inst.device) for n in inst.needs}
            if slots & reserved or not self._fits(inst):
                reserved |= slots
                continue
            for need in inst.needs:
                slot = self._slot(need, inst.device)
                self.in_use[slot] = self.in_use.get(slot, 0) + need.count
            inst.running = True
            inst.waiting = None
            inst.pass_value += inst.priority
            out.append(key)
        return out

    def holding(self) -> dict[tuple[str, int], int]:
        return {k: v for k, v in self.in_use.items() if v}


def parse_resource_flag(text: str) -> tuple[tuple[str, int | None], int]:
    """``--rate-limit-resource NAME:COUNT[:DEVICE]``."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"--rate-limit-resource expects <name>:<count>[:<device>], got '{text}'")
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ValueError(f"--rate-limit-resource expects numbers in '{text}'") from None
    if count < 0 or (device is not None and device < 0):
        raise ValueError(f"--rate-limit-resource counts and devices must be >= 0: '{text}'")
    return (parts[0], device), count
