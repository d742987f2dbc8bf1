"""Sequence batches on the instance thread: control tensors, implicit state, padding rows.

The scheduler's policy gives every batch one :class:`SlotRow` per row. The instance worker
that owns the slots keeps each slot's state (:class:`SlotStates`, touched only on its own
thread): a START row begins from the configured initial state, other rows from what the model
returned for that slot last time; after the run the slot keeps the model's state output, and
an END row (or a ``ReleaseSlots`` notice for an idle or ended sequence) drops it. Padding rows
(``direct`` strategy, a slot with nothing queued) get zero inputs, READY false, and leave the
slot's state untouched.

Ragged inputs (``allow_ragged_batch``) of a model that takes arrays (ONNX Runtime, LibTorch)
reach it flattened over the rows, as Triton's backends flatten them over a batch's requests:
each request's elements one after another, a padding row's zeros in the shape of the batch's
first request (Triton's null request copies that request). The control, correlation ID and
state inputs keep one row per slot; ``batch_input`` tensors count every row, padding included;
a ``BATCH_SCATTER_WITH_INPUT_SHAPE`` output loses the padding rows' parts before it is cut
back per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nursery.config.model import ModelConfig
from nursery.config.sequence import END, READY, START, SequenceConfig
from nursery.errors import InternalError, InvalidArgument
from nursery.execution import batch as batching
from nursery.scheduling.sequence_policy import SlotRow
from nursery.types import DataType, InferenceRequest, InferenceResponse, Tensor


def check_request(request: InferenceRequest, config: ModelConfig, batch_size: int) -> None:
    """Triton's checks of a request to a sequence model, in its order and words: the
    correlation ID's type against the CORRID control (the last of its request checks, before
    the request reaches the scheduler), then the sequence batcher's own."""
    seq = config.sequence
    assert seq is not None
    model = config.name
    corrid = request.sequence_id
    if seq.corrid is not None:
        # a string ID needs a string control; an integer ID (a request without an ID has
        # the integer 0) any integer one
        name, datatype = seq.corrid
        if isinstance(corrid, str) != (datatype is DataType.BYTES):
            given = DataType.BYTES if isinstance(corrid, str) else DataType.UINT64
            raise InvalidArgument(
                f"[request id: {request.id or '<id_unknown>'}] sequence batching control "
                f"'{name}' data-type is '{given.value}', but model '{model}' expects "
                f"'{datatype.value}'")
    if batch_size > 1:
        raise InvalidArgument(f"inference request to model '{model}' must specify batch-size 1 "
                              "due to requirements of sequence batcher")
    if (corrid == 0 or corrid == "") and not seq.schedule.iterative:  # iterative: the
        # scheduler gives it a sequence of its own
        raise InvalidArgument(f"inference request to model '{model}' must specify a non-zero or "
                              "non-empty correlation ID")


class SlotStates:
    """The implicit state of each sequence slot of one instance."""

    def __init__(self, config: ModelConfig) -> None:
        assert config.sequence is not None
        self.config = config
        self.seq: SequenceConfig = config.sequence
        self.batching = config.max_batch_size > 0
        self._states: dict[int, dict[str, np.ndarray]] = {}  # slot -> input name -> array

    def release(self, slots: Sequence[int]) -> None:
        for slot in slots:
            self._states.pop(slot, None)

    def held(self) -> dict[int, dict[str, np.ndarray]]:
        return self._states

    # -- one batch -----------------------------------------------------------------------

    def gather(self, requests: Sequence[InferenceRequest], rows: Sequence[SlotRow],
               data: bool = True) -> dict[str, np.ndarray]:
        """The batch's arrays: the model's own inputs (unless ``data`` is false: a backend
        that takes whole requests reads each request's own, whose shapes may differ when
        the input allows ragged batches), then the control inputs, the correlation ID and
        the implicit state, one row per ``rows`` entry."""
        config = self.config
        n = len(rows)
        arrays: dict[str, np.ndarray] = {}
        first = requests[0]
        for spec in config.inputs if data else ():
            if spec.name not in first.inputs:
                continue
            parts = [np.asarray(t.data) if t is not None else _zeros(shape, t_dtype)
                     for t, shape, t_dtype in self._row_tensors(requests, rows, spec.name)]
            if spec.ragged:  # flattened over the rows, padding rows' zeros among them, as
                # Triton's backends flatten a ragged input over the batch's requests
                arrays[spec.name] = np.concatenate([p.reshape(-1) for p in parts])
                continue
            array = parts[0] if n == 1 else np.concatenate(parts, axis=0)
            if spec.reshape is not None:
                target = (array.shape[0], *spec.reshape) if self.batching else spec.reshape
                array = array.reshape(target)
            arrays[spec.name] = array
        for made in config.batch_inputs if data else ():
            shapes = [shape for _, shape, _ in self._row_tensors(requests, rows, made.source)]
            made_array = batching.batch_input_of_shapes(made, shapes)
            for name in made.targets:
                arrays[name] = made_array
        for control in self.seq.controls:
            values = [self._flag(control.kind, row) for row in rows]
            arrays[control.name] = self._control(
                [control.true if v else control.false for v in values], control.datatype)
        if self.seq.corrid is not None:
            name, datatype = self.seq.corrid
            ids = [row.corrid if row.ready else (b"" if datatype is DataType.BYTES else 0)
                   for row in rows]
            arrays[name] = self._corrid(ids, datatype)
        for state in self.seq.states:
            found: list[np.ndarray | None] = []
            for row in rows:
                held = self._states.get(row.slot)
                if not row.ready:
                    found.append(None)  # a padding row: below
                elif row.start or held is None:
                    found.append(state.initial)
                else:
                    found.append(held[state.input_name])
            # a padding row's state has the shape of the first real row's (Triton's null
            # request copies it): the initial state, or zeros where a variable-size state grew
            like = next((p for p in found if p is not None), state.initial)
            pad = (state.initial if state.initial.shape == like.shape
                   else _zeros(like.shape, like.dtype))
            filled = [p if p is not None else pad for p in found]
            if self.batching:
                arrays[state.input_name] = np.stack(filled)
            else:
                arrays[state.input_name] = filled[0]
        return arrays

    def _row_tensors(self, requests: Sequence[InferenceRequest], rows: Sequence[SlotRow],
                     name: str) -> list[tuple[Tensor | None, tuple[int, ...], np.dtype[Any]]]:
        """Input ``name`` of each row: a ready row's tensor with its shape, and for a padding
        row ``None`` with the shape and type of the batch's first request's (Triton's null
        request copies that request's input shapes and fills them with zeros)."""
        template = requests[0].inputs.get(name)
        if template is None:
            raise InternalError(f"input '{name}' is not given by the first request of a batch")
        blank = np.asarray(template.data).dtype
        out: list[tuple[Tensor | None, tuple[int, ...], np.dtype[Any]]] = []
        for row in rows:
            if not row.ready:
                out.append((None, tuple(template.shape), blank))
                continue
            tensor = requests[row.item].inputs.get(name)
            if tensor is None:
                raise InternalError(f"optional input '{name}' is given by only some requests "
                                    "of a batch")
            out.append((tensor, tuple(tensor.shape), blank))
        return out

    def _flag(self, kind: str, row: SlotRow) -> bool:
        if kind == READY:
            return row.ready
        if not row.ready:
            return False
        return row.start if kind == START else row.end if kind == END else False

    def _control(self, values: list[Any], datatype: DataType) -> np.ndarray:
        array = np.array(values, dtype=datatype.numpy_dtype)
        return array.reshape(len(values), 1) if self.batching else array.reshape(1)

    def _corrid(self, ids: list[Any], datatype: DataType) -> np.ndarray:
        if datatype is DataType.BYTES:
            array = np.array([i.encode() if isinstance(i, str) else i for i in ids], dtype=object)
        else:  # a 32-bit control carries the ID's low-order 32 bits, as in Triton
            bits = 64 if datatype.itemsize == 8 else 32
            raw = np.array([int(i) & ((1 << bits) - 1) for i in ids],
                           dtype=np.uint64 if bits == 64 else np.uint32)
            array = raw.view(datatype.numpy_dtype)
        return array.reshape(len(ids), 1) if self.batching else array.reshape(1)

    def output_names(self, requests: Sequence[InferenceRequest]) -> list[str]:
        names = batching.output_names(requests, self.config)
        return names + [n for n in self.seq.state_outputs if n not in names]

    def scatter(self, requests: Sequence[InferenceRequest], rows: Sequence[SlotRow],
                results: dict[str, np.ndarray], version: str) -> list[InferenceResponse]:
        """Keep each ready row's state output for its slot; answer the real requests."""
        listed = {o.name for o in self.config.outputs}  # a state listed as an output too
        for state in self.seq.states:                   # is also answered when asked for
            out = (results.get if state.output_name in listed else results.pop)(
                state.output_name, None)
            if out is None:
                raise InternalError(f"model '{self.config.name}' did not produce its state "
                                    f"output '{state.output_name}'")
            out = np.asarray(out)
            for index, row in enumerate(rows):
                if not row.ready:
                    continue
                value = np.array(out[index] if self.batching else out, copy=True)
                self._states.setdefault(row.slot, {})[state.input_name] = value
        for row in rows:
            if row.ready and row.end:
                self._states.pop(row.slot, None)  # the sequence is over: its state goes
        real = [i for i, row in enumerate(rows) if row.ready]
        if len(real) != len(rows) and self.batching:
            keep = np.array(real)
            results = {name: self._scattered_without_padding(requests, rows, name, array)
                       if name in self.config.batch_scatter else np.asarray(array)[keep]
                       for name, array in results.items()}
        return batching.split_outputs(requests, [1] * len(requests), results, self.config,
                                      version)

    def _scattered_without_padding(self, requests: Sequence[InferenceRequest],
                                   rows: Sequence[SlotRow], name: str,
                                   array: np.ndarray) -> np.ndarray:
        """A BATCH_SCATTER_WITH_INPUT_SHAPE output with the padding rows' parts taken out:
        every row has as many elements as its source input (a padding row's, the first
        request's), one row after another; the ready rows' parts are left, in order."""
        flat = np.asarray(array).reshape(-1)
        source = self.config.batch_scatter[name]
        counts = [int(np.prod(shape, dtype=np.int64))
                  for _, shape, _ in self._row_tensors(requests, rows, source)]
        if sum(counts) != flat.size:
            raise InternalError(
                f"model '{self.config.name}' output '{name}' has {flat.size} elements, the "
                f"batch output needs {sum(counts)} (the elements of input '{source}')")
        bounds = np.cumsum([0, *counts])
        return np.concatenate([flat[bounds[i]:bounds[i + 1]]
                               for i, row in enumerate(rows) if row.ready])


def _zeros(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """A padding row's zeros: empty strings for BYTES (object), as the zeroed buffer of
    Triton's null request reads."""
    if dtype.kind == "O":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype)
