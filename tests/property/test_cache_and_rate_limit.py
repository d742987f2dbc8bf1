"""Hypothesis: the response cache's key and byte-budgeted LRU store, and the rate limiter's
policy (resources never over-committed, every waiting instance eventually runs, priorities
weight the turns)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nursery.scheduling.cache_store import (
    CacheConfig,
    LruStore,
    entry_fields,
    parse_cache_config,
    request_key,
    response_from_fields,
)
from nursery.scheduling.rate_limit_policy import (
    GLOBAL,
    RateLimitError,
    RateLimitPolicy,
    ResourceNeed,
    parse_resource_flag,
)
from nursery.types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor

# -- the key -----------------------------------------------------------------------------------

_DTYPES = ["INT32", "FP32", "UINT8", "INT64", "BYTES"]


@st.composite
def _tensor(draw: st.DrawFn, name: str) -> Tensor:
    dt = DataType.from_protocol(draw(st.sampled_from(_DTYPES)))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    n = int(np.prod(shape))
    if dt is DataType.BYTES:
        values = draw(st.lists(st.binary(max_size=5), min_size=n, max_size=n))
        data = np.array(values, dtype=object).reshape(shape)
    else:
        raw = draw(st.binary(min_size=n * dt.itemsize, max_size=n * dt.itemsize))
        data = np.frombuffer(raw, dtype=dt.numpy_dtype).reshape(shape)
    return Tensor(name, dt, shape, data)


@st.composite
def _request(draw: st.DrawFn) -> InferenceRequest:
    names = draw(st.lists(st.sampled_from(["A", "B", "C"]), min_size=1, max_size=3, unique=True))
    inputs = {n: draw(_tensor(n)) for n in names}
    outs = draw(st.lists(st.sampled_from(["X", "Y"]), max_size=2, unique=True))
    return InferenceRequest("m", "1", inputs,
                            tuple(RequestedOutput(o, draw(st.integers(0, 2))) for o in outs))


def _copy(req: InferenceRequest, reverse: bool = False) -> InferenceRequest:
    items = list(req.inputs.items())
    if reverse:
        items.reverse()
    inputs = {n: Tensor(t.name, t.datatype, t.shape, t.data.copy()) for n, t in items}
    return InferenceRequest(req.model_name, req.model_version, inputs, req.requested_outputs,
                            id="another-id")


@settings(max_examples=150, deadline=None)
@given(_request())
def test_equal_requests_hash_equal(req: InferenceRequest) -> None:
    assert request_key("m", 1, req) == request_key("m", 1, _copy(req, reverse=True))
    assert request_key("m", 1, req) != request_key("m", 2, req)
    assert request_key("m", 1, req) != request_key("n", 1, req)


@settings(max_examples=150, deadline=None)
@given(_request(), st.data())
def test_any_change_changes_the_key(req: InferenceRequest, data: st.DataObject) -> None:
    key = request_key("m", 1, req)
    name = data.draw(st.sampled_from(sorted(req.inputs)))
    t = req.inputs[name]
    changed = _copy(req)
    what = data.draw(st.sampled_from(["bytes", "shape", "dtype", "outputs", "classes"]))
    if what == "bytes":
        flat = t.data.reshape(-1).copy()
        if t.datatype is DataType.BYTES:
            flat[0] = flat[0] + b"!"
        else:
            raw = bytearray(flat.tobytes())
            raw[0] ^= 0xFF
            flat = np.frombuffer(bytes(raw), dtype=t.data.dtype)
        changed.inputs[name] = Tensor(name, t.datatype, t.shape, flat.reshape(t.shape))
    elif what == "shape":
        shape = (*t.shape, 1)
        changed.inputs[name] = Tensor(name, t.datatype, shape, t.data.reshape(shape))
    elif what == "dtype":  # same bytes, same shape, another datatype of the same width
        twin = {"INT32": "FP32", "FP32": "INT32", "UINT8": "INT8", "INT64": "FP64"}
        if t.datatype.value not in twin:
            return
        other = DataType.from_protocol(twin[t.datatype.value])
        changed.inputs[name] = Tensor(name, other, t.shape, t.data.view(other.numpy_dtype))
    elif what == "outputs":
        names = {o.name for o in req.requested_outputs}
        extra = "Y" if "Y" not in names else "Z"
        changed.requested_outputs = (*req.requested_outputs, RequestedOutput(extra))
    else:
        if not req.requested_outputs:
            return
        first = req.requested_outputs[0]
        changed.requested_outputs = (RequestedOutput(first.name, first.classification + 1),
                                     *req.requested_outputs[1:])
    assert request_key("m", 1, changed) != key


# -- the LRU store -----------------------------------------------------------------------------


class LruMachine(RuleBasedStateMachine):
    """The store against a plain model: contents, recency order and the budget."""

    def __init__(self) -> None:
        super().__init__()
        self.budget = 100
        self.store = LruStore(self.budget)
        self.model: OrderedDict[bytes, tuple[int, int]] = OrderedDict()  # key -> (value, size)

    @rule(k=st.integers(0, 8), size=st.integers(0, 130), value=st.integers())
    def put(self, k: int, size: int, value: int) -> None:
        key = bytes([k])
        stored = self.store.put(key, value, size)
        assert stored == (size <= self.budget)
        if not stored:
            return  # never stored, nothing evicted
        self.model.pop(key, None)
        while sum(s for _, s in self.model.values()) + size > self.budget:
            self.model.popitem(last=False)  # least recently used first
        self.model[key] = (value, size)

    @rule(k=st.integers(0, 8))
    def get(self, k: int) -> None:
        key = bytes([k])
        found = self.store.get(key)
        if key in self.model:
            assert found == self.model[key][0]
            self.model.move_to_end(key)
        else:
            assert found is None

    @invariant()
    def within_budget_and_same_order(self) -> None:
        assert self.store.used <= self.budget
        assert self.store.used == sum(s for _, s in self.model.values())
        assert self.store.keys() == list(self.model)


TestLru = LruMachine.TestCase
TestLru.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_cache_config_parsing() -> None:
    assert parse_cache_config([]) is None
    assert parse_cache_config(["local,size=1048576"]) == CacheConfig("local", size=1048576)
    assert parse_cache_config([], 8192) == CacheConfig("local", size=8192)  # the old flag
    for bad in (["redis,host=x"], ["local,bytes=1"], ["local,size=many"], ["local"],
                ["memcached,size=1"], [",size=1"], ["local,size="]):
        with pytest.raises(ValueError, match="cache|local|size|host"):
            parse_cache_config(bad)


def test_cache_config_errors_in_tritons_words() -> None:
    with pytest.raises(ValueError, match="multiple cache configurations, but only a single"):
        parse_cache_config(["local,size=8192", "redis,key=value"])
    with pytest.raises(ValueError, match="Incompatible flags --response-cache-byte-size and "
                                         "--cache-config both provided"):
        parse_cache_config(["local,size=1"], 12345)
    with pytest.raises(ValueError, match="Must at a minimum specify 'host' and 'port'"):
        parse_cache_config(["redis,port=localhost"])


def test_redis_cache_options() -> None:
    config = parse_cache_config(
        ["redis,host=cache.example", "redis,port=6380", "redis,db=2", "redis,pool_size=4",
         "redis,wait_timeout=50", "redis,password=a=b,c", "redis,flavour=x"], environ={})
    assert config is not None and config.name == "redis" and config.redis is not None
    redis = config.redis
    assert (redis.host, redis.port, redis.db, redis.pool_size, redis.wait_timeout) == (
        "cache.example", 6380, 2, 4, 50)
    assert redis.password == "a=b,c"  # the value runs to the end of the entry
    assert redis.ignored == ("flavour",)  # Triton ignores what it does not read; so does this
    assert "a=b,c" not in repr(redis)
    assert (redis.connect_timeout, redis.socket_timeout, redis.tls_enabled) == (0, 0, False)
    # numbers are read as C's atoi reads them, as Triton's Redis cache does
    odd = parse_cache_config(["redis,host=h", "redis,port=nonexistent"], environ={})
    assert odd is not None and odd.redis is not None and odd.redis.port == 0
    # credentials from the environment unless the flags give them
    env = {"TRITONCACHE_REDIS_USERNAME": "alice", "TRITONCACHE_REDIS_PASSWORD": "s3cret"}
    both = parse_cache_config(["redis,host=h", "redis,port=1"], environ=env)
    assert both is not None and both.redis is not None
    assert (both.redis.user, both.redis.password) == ("alice", "s3cret")
    flag = parse_cache_config(["redis,host=h", "redis,port=1", "redis,password=p"],
                              environ=env)
    assert flag is not None and flag.redis is not None and flag.redis.password == "p"


@given(st.dictionaries(st.sampled_from(["0.name", "outputs", "format", "0.data", "0.shape",
                                         "parameters", "model", "version", "0.datatype"]),
                       st.binary(max_size=24)))
def test_damaged_redis_entries_are_refused_not_crashed_on(fields: dict[str, bytes]) -> None:
    try:
        response_from_fields({k.encode(): v for k, v in fields.items()})
    except ValueError:
        pass


def test_redis_entry_round_trip() -> None:
    response = InferenceResponse("m", "3", [
        Tensor("A", DataType.FP32, (1, 2), np.arange(2, dtype=np.float32).reshape(1, 2)),
        Tensor("S", DataType.BYTES, (2,), np.array([b"x", b"\x00yz"], dtype=object)),
        Tensor("E", DataType.INT8, (), np.array(5, np.int8))], "id-1", {"p": 1, "q": "r"})
    back = response_from_fields(entry_fields(response))
    assert (back.model_name, back.model_version, back.id, back.parameters) == (
        "m", "3", "", {"p": 1, "q": "r"})
    for a, b in zip(response.outputs, back.outputs, strict=True):
        assert (a.name, a.datatype, a.shape) == (b.name, b.datatype, b.shape)
        assert a.data.tolist() == b.data.tolist() and not b.data.flags.writeable


# -- the rate limiter's policy -----------------------------------------------------------------


class RateLimitMachine(RuleBasedStateMachine):
    """Instances on two devices asking for shared resources: what is granted never exceeds
    what exists; whenever nothing runs, a waiting instance is granted (no deadlock); a waiting
    instance is granted within a bounded number of others' grants (no starvation); a running
    instance that asks for its next turn is never granted before it releases."""

    LIMITS = {"R1": 2, "R2": 3, "G": 2}

    def __init__(self) -> None:
        super().__init__()
        self.policy = RateLimitPolicy({(n, None): c for n, c in self.LIMITS.items()})
        self.running: set[int] = set()
        self.ahead: set[int] = set()  # running, and asked for the next turn already
        self.waiting: dict[int, int] = {}  # key -> grants given to others since it asked
        self.needs: dict[int, tuple[ResourceNeed, ...]] = {}
        self.devices: dict[int, int] = {}

    @rule(key=st.integers(0, 5), device=st.integers(0, 1),
          needs=st.lists(st.tuples(st.sampled_from(["R1", "R2", "G"]), st.integers(0, 3)),
                         max_size=3, unique_by=lambda t: t[0]),
          priority=st.integers(0, 3))
    def register(self, key: int, device: int, needs: list[tuple[str, int]],
                 priority: int) -> None:
        if key in self.needs:
            return
        spec = tuple(ResourceNeed(n, c, n == "G") for n, c in needs)
        too_many = any(c > self.LIMITS[n] for n, c in needs)
        if too_many:
            with pytest.raises(RateLimitError):
                self.policy.register(key, device, spec, priority)
            return
        self.policy.register(key, device, spec, priority)
        self.needs[key] = spec
        self.devices[key] = device

    @precondition(lambda self: self.needs)
    @rule(data=st.data())
    def request(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.needs)))
        if key in self.running or key in self.waiting:
            return
        self.policy.request(key)
        self.waiting[key] = 0
        self._grant()

    @precondition(lambda self: self.running - self.ahead)
    @rule(data=st.data())
    def request_ahead(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.running - self.ahead)))
        self.policy.request(key)
        self.ahead.add(key)
        self._grant()

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.running)))
        self.policy.release(key)
        self.running.discard(key)
        if key in self.ahead:  # from now on it waits as any other
            self.ahead.discard(key)
            self.waiting[key] = 0
        self._grant()

    def _grant(self) -> None:
        for key in self.policy.grants():
            assert key in self.waiting and key not in self.running
            del self.waiting[key]
            self.running.add(key)
            for other in self.waiting:
                self.waiting[other] += 1

    @invariant()
    def never_over_committed(self) -> None:
        used: dict[tuple[str, int], int] = {}
        for key in self.running:
            for n in self.needs[key]:
                slot = (n.name, GLOBAL if n.is_global else self.devices[key])
                used[slot] = used.get(slot, 0) + n.count
        for (name, device), count in used.items():
            assert count <= self.policy.capacity(name, device)
        assert {k: v for k, v in used.items() if v} == self.policy.holding()

    @invariant()
    def no_deadlock_no_starvation(self) -> None:
        if self.waiting:
            assert self.running, "instances wait while nothing runs"
        # stride scheduling with reservations: nobody waits through more than
        # (instances x max priority) grants of others
        assert all(v <= 6 * 3 for v in self.waiting.values())


TestRateLimit = RateLimitMachine.TestCase
TestRateLimit.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)


def test_priority_weights_the_turns() -> None:
    policy = RateLimitPolicy()
    policy.register("a", 0, (ResourceNeed("R", 1),), 1)
    policy.register("b", 0, (ResourceNeed("R", 1),), 2)
    turns = []
    for _ in range(300):
        policy.request("a")
        policy.request("b")
        granted = policy.grants()
        assert len(granted) == 1  # one copy of R: one at a time
        turns.append(granted[0])
        policy.release(granted[0])
    assert turns.count("a") == pytest.approx(2 * turns.count("b"), rel=0.05)


@pytest.mark.parametrize("registered", ["ab", "ba"])
@pytest.mark.parametrize("first", ["a", "b"])
def test_priority_turns_keep_tritons_cycle_whoever_asks_first(first: str, registered: str) -> None:
    """Two always-busy instances, priorities 1 and 2, one copy of the resource (L0_rate_limiter's
    cross-model case), registered and asking in either order: after the start, the turns run
    a, a, b as Triton 2.51 gives them, so when ``a`` is granted its 2k-th turn, ``b`` has had
    fewer than k (the test stops ``b`` at ``a``'s 72nd answer and needs ``b`` at 35 or fewer
    then)."""
    policy = RateLimitPolicy()
    for key in registered:  # the models load in parallel: either may register first
        policy.register(key, 0, (ResourceNeed("R", 1),), {"a": 1, "b": 2}[key])
    policy.request(first)  # alone at first: granted at once
    turns = policy.grants()
    policy.request("b" if first == "a" else "a")
    for _ in range(120):
        policy.release(turns[-1])
        policy.request(turns[-1])
        granted = policy.grants()
        assert len(granted) == 1
        turns.append(granted[0])
    settled = "".join(turns[turns.index("b", 1):])  # from b's first turn after the start
    assert "aab" * 10 in settled, "".join(turns)
    for i, turn in enumerate(turns):
        a = turns[:i + 1].count("a")
        if turn == "a" and a >= 4 and a % 2 == 0:
            assert turns[:i].count("b") < a // 2, "".join(turns)


def test_a_running_instance_asking_ahead_keeps_its_weighted_turns() -> None:
    """The worker asks for its next turn while its batch runs (L0_rate_limiter's two models,
    one resource, priorities 1 and 2, each always busy): the release reaches the limiter
    before a next request would otherwise, and the turns still go 2 to 1."""
    policy = RateLimitPolicy()
    policy.register("a", 0, (ResourceNeed("R", 1),), 1)
    policy.register("b", 0, (ResourceNeed("R", 1),), 2)
    policy.request("a")
    policy.request("b")
    turns = []
    for _ in range(300):
        granted = policy.grants()
        assert len(granted) == 1
        turns.append(granted[0])
        policy.request(granted[0])  # its next batch is queued while this one runs
        assert policy.grants() == []  # never granted before it releases
        policy.release(granted[0])
    assert turns.count("a") == pytest.approx(2 * turns.count("b"), rel=0.05)


def test_default_capacity_is_the_largest_request_and_explicit_limits_refuse() -> None:
    policy = RateLimitPolicy()
    policy.register("a", 0, (ResourceNeed("R1", 4), ResourceNeed("R2", 4)), 1)
    policy.register("b", 0, (ResourceNeed("R2", 5),), 1)
    assert (policy.capacity("R1", 0), policy.capacity("R2", 0)) == (4, 5)
    strict = RateLimitPolicy({("R1", None): 1})
    with pytest.raises(RateLimitError, match='Resource count for "R1" is limited to 1 which '
                       "will prevent scheduling of one or more model instances, the minimum "
                       "required count is 2"):
        strict.register("a", 0, (ResourceNeed("R1", 2),), 1)
    per_device = RateLimitPolicy({("R2", 1): 8, ("R2", None): 5})
    assert (per_device.capacity("R2", 0), per_device.capacity("R2", 1)) == (5, 8)


def test_explicit_counts_leave_unnamed_resources_empty_as_triton_does() -> None:
    """L0_rate_limiter: once any --rate-limit-resource is given, a resource no flag names
    (or names for another device only) has no copies; the message names the largest count
    any instance of the pool asks for; a global resource takes the largest count given for
    its name on any device."""
    policy = RateLimitPolicy({("R1", 10): 10, ("R2", None): 2})
    with pytest.raises(RateLimitError, match='"R1" is limited to 0 .* count is 4'):
        policy.register("a", 0, (ResourceNeed("R1", 4),), 1)
    policy.register("b", 0, (ResourceNeed("R2", 2, True),), 1)
    assert policy.capacity("R2", GLOBAL) == 2 and policy.capacity("R1", 10) == 10
    larger = RateLimitPolicy({("R1", None): 3})
    larger.register("small", 0, (ResourceNeed("R1", 2),), 1)
    with pytest.raises(RateLimitError, match='"R1" is limited to 3 .* count is 4'):
        larger.register("big", 0, (ResourceNeed("R1", 4),), 1)
    with pytest.raises(RateLimitError, match='"G" is limited to 0'):
        larger.register("global", 0, (ResourceNeed("G", 1, True),), 1)


def test_a_resource_both_global_and_per_device_is_refused() -> None:
    policy = RateLimitPolicy()
    policy.register("a", 0, (ResourceNeed("R2", 2, True),), 1)
    with pytest.raises(RateLimitError, match='^Resource "R2" is present as both global and '
                       "device-specific resource in the model configuration.$"):
        policy.register("b", 0, (ResourceNeed("R2", 2),), 1)
    assert parse_resource_flag("R2:8:1") == (("R2", 1), 8)
    with pytest.raises(ValueError, match="expects"):
        parse_resource_flag("R2")
