"""The ``sequence_batching`` block of a model configuration, validated and frozen.

Control inputs (START, END, READY, CORRID) and implicit state tensors are inputs the server
adds to every request of a sequence model: clients never send them and the config's ``input``
list does not name them. Validation follows Triton's rules and messages
(``GetBooleanSequenceControlProperties`` / ``GetTypedSequenceControlProperties`` and the
state checks of the sequence batcher).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import betterproto
import numpy as np

from nursery.errors import ConfigError, InvalidArgument
from nursery.scheduling.sequence_schedule import SequenceSchedule
from nursery.schema import inference as pb
from nursery.types import DataType, checked_count, deserialize_bytes_tensor

START = "CONTROL_SEQUENCE_START"
END = "CONTROL_SEQUENCE_END"
READY = "CONTROL_SEQUENCE_READY"
CORRID = "CONTROL_SEQUENCE_CORRID"
_KIND_NAMES = {0: START, 1: READY, 2: END, 3: CORRID}
_CORRID_TYPES = (DataType.UINT64, DataType.INT64, DataType.UINT32, DataType.INT32,
                 DataType.BYTES)


@dataclass(frozen=True, slots=True)
class ControlSpec:
    """A boolean control: the tensor ``name`` carries ``false`` or ``true`` per row."""

    kind: str
    name: str
    datatype: DataType
    false: Any
    true: Any


@dataclass(frozen=True, slots=True)
class StateSpec:
    input_name: str
    output_name: str
    datatype: DataType
    dims: tuple[int, ...]
    initial: np.ndarray  # the state a sequence starts from (zeros, or the data file)


@dataclass(frozen=True)
class SequenceConfig:
    schedule: SequenceSchedule
    controls: tuple[ControlSpec, ...]  # START / END / READY that the model takes
    corrid: tuple[str, DataType] | None  # CORRID tensor name and datatype
    states: tuple[StateSpec, ...]

    @property
    def extra_inputs(self) -> tuple[str, ...]:
        """Inputs the server provides: control and state tensors."""
        return tuple(self.extra_input_types)

    @property
    def extra_input_types(self) -> dict[str, DataType]:
        """The server-provided inputs and their datatypes."""
        types = {c.name: c.datatype for c in self.controls}
        types.update((s.input_name, s.datatype) for s in self.states)
        if self.corrid is not None:
            types[self.corrid[0]] = self.corrid[1]
        return types

    @property
    def state_outputs(self) -> tuple[str, ...]:
        return tuple(s.output_name for s in self.states)


def sequence_config(proto: pb.ModelConfig, model_path: Path, where: str) -> SequenceConfig:
    sb = proto.sequence_batching
    name = proto.name
    label = f"{where}: config.pbtxt"
    controls: list[ControlSpec] = []
    corrid: tuple[str, DataType] | None = None
    seen_tensors: set[str] = set()
    seen_kinds: set[str] = set()
    for ci in sb.control_input:
        if not ci.name:
            raise ConfigError(f"{label}: sequence batching control tensor must have a name for "
                              f"{name}")
        if ci.name in seen_tensors:
            raise ConfigError(f"{label}: sequence batching control tensor '{ci.name}' is "
                              f"specified for multiple control kinds for {name}")
        seen_tensors.add(ci.name)
        for c in ci.control:
            kind = _KIND_NAMES.get(int(c.kind))
            if kind is None:
                raise ConfigError(f"{label}: unknown sequence batching control kind {c.kind}")
            if kind in seen_kinds:
                raise ConfigError(f"{label}: sequence batching specifies multiple {kind} "
                                  f"tensors for {name}")
            seen_kinds.add(kind)
            found = [arm for arm, values in (("int32_false_true", c.int32_false_true),
                                             ("fp32_false_true", c.fp32_false_true),
                                             ("bool_false_true", c.bool_false_true)) if values]
            if kind == CORRID:
                if found:
                    raise ConfigError(
                        f"{label}: sequence batching must not specify either 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {kind} for {name}")
                datatype = DataType.from_config(c.data_type) if c.data_type else None
                if datatype not in _CORRID_TYPES:
                    raise ConfigError(
                        f"{label}: unexpected control data type, expected TYPE_UINT64, "
                        f"TYPE_INT64, TYPE_UINT32, TYPE_INT32, or TYPE_STRING for {kind} for "
                        f"{name}")
                corrid = (ci.name, datatype)
                continue
            if not found:
                raise ConfigError(
                    f"{label}: sequence batching must specify either 'int32_false_true', "
                    f"'fp32_false_true' or 'bool_false_true' for {kind} for {name}")
            if len(found) > 1:
                raise ConfigError(
                    f"{label}: sequence batching specifies more than one from 'int32_false_true', "
                    f"'fp32_false_true' and 'bool_false_true' for {kind} for {name}")
            arm = found[0]
            values = list(getattr(c, arm))
            if len(values) != 2:
                raise ConfigError(f"{label}: sequence batching control '{arm}' must have exactly "
                                  f"2 entries for {kind} for {name}")
            datatype = {"int32_false_true": DataType.INT32, "fp32_false_true": DataType.FP32,
                        "bool_false_true": DataType.BOOL}[arm]
            controls.append(ControlSpec(kind, ci.name, datatype, values[0], values[1]))
    inputs = {t.name for t in proto.input}
    for ci in sb.control_input:
        if ci.name in inputs:
            raise ConfigError(f"{label}: control input '{ci.name}' must not also be listed in "
                              "'input': the server provides it")
    states = tuple(_state(s, proto, model_path, label, inputs | seen_tensors)
                   for s in sb.state)
    strategy, _ = betterproto.which_one_of(sb, "strategy_choice")
    mbs = max(proto.max_batch_size, 0)
    if strategy == "oldest":
        oldest = sb.oldest
        for size in oldest.preferred_batch_size:
            if size < 1 or size > max(mbs, 1):
                raise ConfigError(f"{label}: sequence batching preferred batch size must be "
                                  f"positive and <= max batch size for {name}")
        schedule = SequenceSchedule(
            # Triton's default: as many candidate sequences as a batch has rows
            strategy="oldest", slots_per_instance=(oldest.max_candidate_sequences
                                                   if oldest.max_candidate_sequences > 0
                                                   else max(mbs, 1)),
            max_batch_size=max(mbs, 1), idle_us=sb.max_sequence_idle_microseconds,
            preferred_batch_sizes=tuple(sorted(oldest.preferred_batch_size)),
            max_queue_delay_us=oldest.max_queue_delay_microseconds)
    else:
        # no strategy given: Triton's default, the direct one with its defaults (reading
        # ``sb.direct`` when no arm is set raises AttributeError in betterproto)
        direct = sb.direct if strategy == "direct" else pb.ModelSequenceBatchingStrategyDirect()
        schedule = SequenceSchedule(
            strategy="direct", slots_per_instance=max(mbs, 1), max_batch_size=max(mbs, 1),
            idle_us=sb.max_sequence_idle_microseconds,
            max_queue_delay_us=direct.max_queue_delay_microseconds,
            min_slot_utilization=direct.minimum_slot_utilization)
    if sb.iterative_sequence:  # Triton's IterativeSequencer (see scheduling/sequence_policy)
        schedule = replace(schedule, iterative=True)
    return SequenceConfig(schedule, tuple(controls), corrid, states)


def _state(s: pb.ModelSequenceBatchingState, proto: pb.ModelConfig, model_path: Path,
           label: str, taken_inputs: set[str]) -> StateSpec:
    name = proto.name
    if not s.input_name or not s.output_name:
        raise ConfigError(f"{label}: sequence batching state must specify 'input_name' and "
                          f"'output_name' for {name}")
    where = f"{label}: sequence batching state '{s.input_name}'"
    if s.input_name in taken_inputs:
        raise ConfigError(f"{where}: the state input name is already used by an input or a "
                          "control input")
    if not s.data_type:
        raise ConfigError(f"{where} must specify 'data_type'")
    datatype = DataType.from_config(s.data_type)  # TYPE_STRING included, as Triton's
    if not s.dims:
        raise ConfigError(f"{where} must specify 'dims'")
    dims = tuple(int(d) for d in s.dims)
    if any(d < 1 and d != -1 for d in dims):
        raise ConfigError(f"{where}: dimension must be integer >= 1, or -1 to indicate a "
                          "variable-size dimension")
    if len(s.initial_state) > 1:
        raise ConfigError(f"{where}: only one initial state is supported")
    if not s.initial_state:  # zeros; a variable-size dim is 1 for a sequence's first request
        initial = _zeros(tuple(1 if d == -1 else d for d in dims), datatype, where)
    else:
        init = s.initial_state[0]
        init_dims = tuple(int(d) for d in init.dims)
        if init.data_type and init.data_type != s.data_type:
            raise ConfigError(f"{where}: initial state '{init.name}' data_type must match the "
                              "state's data_type")
        if len(init_dims) != len(dims) or any(d != -1 and d != i
                                               for d, i in zip(dims, init_dims, strict=True)):
            raise ConfigError(f"{where}: initial state '{init.name}' dims {list(init_dims)} do "
                              f"not match the state's dims {list(dims)}")
        if any(d < 0 for d in init_dims):
            raise ConfigError(f"{where}: initial state '{init.name}' must have fixed dims")
        arm, _ = betterproto.which_one_of(init, "state_data")
        if arm == "data_file":
            value = init.data_file
            path = (model_path / "initial_state" / value).resolve()
            if not path.is_relative_to(model_path.resolve()):
                raise ConfigError(f"{where}: initial state data file '{value}' is outside the "
                                  "model folder")
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise ConfigError(f"{where}: failed to read initial state data file "
                                  f"'{path}': {exc.strerror}") from None
            count = _count(init_dims, datatype, where)  # np.prod would wrap around
            if datatype is DataType.BYTES:  # length-prefixed elements, as a BYTES tensor's
                try:
                    initial = deserialize_bytes_tensor(raw, count, f"initial state data "
                                                       f"file '{value}'").reshape(init_dims)
                except InvalidArgument as exc:
                    raise ConfigError(f"{where}: {exc}") from None
            elif len(raw) != count * datatype.itemsize:
                raise ConfigError(f"{where}: initial state data file '{value}' has {len(raw)} "
                                  f"bytes, expected {count * datatype.itemsize}")
            else:
                initial = np.frombuffer(raw, dtype=datatype.numpy_dtype).reshape(
                    init_dims).copy()
        elif arm == "zero_data":
            initial = _zeros(init_dims, datatype, where)
        else:
            raise ConfigError(f"{where}: initial state '{init.name}' must specify 'zero_data' "
                              "or 'data_file'")
    initial.setflags(write=False)
    return StateSpec(s.input_name, s.output_name, datatype, dims, initial)


def _count(dims: tuple[int, ...], datatype: DataType, where: str) -> int:
    try:
        return checked_count(dims, datatype, f"{where}: dims")
    except InvalidArgument as exc:
        raise ConfigError(str(exc)) from None


def _zeros(dims: tuple[int, ...], datatype: DataType, where: str) -> np.ndarray:
    """A zero initial state, once its dims can be an array and the memory can be had (a
    configuration may come from a client, through a repository load request)."""
    _count(dims, datatype, where)
    try:
        if datatype is DataType.BYTES:  # every element an empty string (Triton's zero)
            return np.full(dims, b"", dtype=object)
        return np.zeros(dims, dtype=datatype.numpy_dtype)
    except MemoryError:
        raise ConfigError(f"{where}: dims {list(dims)} are too large to allocate") from None
