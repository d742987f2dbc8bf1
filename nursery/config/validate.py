"""Triton's model-configuration rules, with the words Triton's own qa scripts grep for.

Triton validates a configuration in two passes, and so does this module:

- :func:`validate_model_config` (Triton's ValidateModelConfig): what needs no model file, run
  when the configuration is read, before any version folder is looked at (a model without
  versions still gets its configuration error, as under Triton);
- :func:`validate_model_io` (ValidateModelIOConfig): inputs, outputs, their reshapes and the
  batch inputs/outputs, run before the versions when auto-complete is off and after the
  backend auto-completed the configuration otherwise.

Each raises :class:`ConfigError` with Triton's message (ending "for <model>", as Triton's
do), so a user grepping Triton's log for a known message finds it in nursery's. nursery's
own, more specific checks (model.py, sequence.py) still run afterwards on what passes here.
"""

from __future__ import annotations

import betterproto

from nursery.config import pbtext
from nursery.errors import ConfigError
from nursery.schema import inference as pb

WILDCARD = -1


def _present(message: betterproto.Message, name: str) -> bool:
    return pbtext.is_present(message, pbtext.fields_of(type(message))[name])


def validate_model_config(proto: pb.ModelConfig, where: str = "") -> None:
    """Triton's checks of a configuration that need no model file (ValidateModelConfig's
    max_batch_size and ensemble-scheduling rules; the batching rules are model.py's).
    ``where`` (``model 'm': config.pbtxt``) goes before Triton's message."""
    try:
        _validate_model_config(proto)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}" if where else str(exc)) from None


def _validate_model_config(proto: pb.ModelConfig) -> None:
    name = proto.name
    if proto.max_batch_size < 0:
        raise ConfigError(f"'max_batch_size' must be non-negative value for {name}")
    scheduling, _ = betterproto.which_one_of(proto, "scheduling_choice")
    if scheduling == "ensemble_scheduling" and proto.platform != "ensemble":
        raise ConfigError(f"ensemble scheduling cannot be set for model '{name}' whose "
                          "platform is not ensemble")
    if scheduling != "ensemble_scheduling" and proto.platform == "ensemble":
        raise ConfigError(f"ensemble scheduling must be set for ensemble {name} whose "
                          "platform is ensemble")
    if scheduling == "ensemble_scheduling":
        _validate_ensemble(proto)
    for control in proto.model_metrics.metric_control:  # ValidateModelMetrics
        if not _present(control, "metric_identifier"):
            raise ConfigError("metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise ConfigError("metric identifier must specify non-empty 'family'")
        if not _present(control, "histogram_options"):
            raise ConfigError("metric control must specify 'histogram_options'")
        if not control.histogram_options.buckets:
            raise ConfigError("histogram options must specify non-empty 'buckets'")


def _validate_ensemble(proto: pb.ModelConfig) -> None:
    """Triton's ValidateEnsembleSchedulingConfig: what an ensemble may not set, each step's
    fields, then the data flow from the ensemble's inputs to its outputs (every output
    written, every ensemble tensor used)."""
    name = proto.name
    if proto.instance_group:
        raise ConfigError(f"instance group should not be specified for ensemble '{name}'")
    if _present(proto, "optimization"):
        raise ConfigError(f"optimization should not be specified for ensemble '{name}'")
    if proto.model_warmup:
        raise ConfigError(f"model_warmup can not be specified for ensemble '{name}'")
    steps = proto.ensemble_scheduling.step
    if not steps:
        raise ConfigError(f"must specify 'step' for ensemble '{name}'")
    # the graph: each ensemble tensor, whether a step writes it, and its neighbours
    written: set[str] = set()
    readers: dict[str, set[str]] = {}  # tensor -> tensors computed from it
    sources: dict[str, set[str]] = {}  # tensor -> tensors it is computed from
    tensors: list[str] = []  # in the order Triton's graph meets them

    def meet(tensor: str) -> None:
        if tensor not in readers:
            readers[tensor], sources[tensor] = set(), set()
            tensors.append(tensor)

    for i, step in enumerate(steps):
        for field, what in (("model_name", step.model_name), ("input_map", step.input_map),
                            ("output_map", step.output_map)):
            if not what:
                raise ConfigError(f"must specify '{field}' in step {i} of ensemble '{name}'")
        outputs = []
        for tensor in step.output_map.values():
            if tensor in written:
                raise ConfigError(f"ensemble tensor '{tensor}' can appear in an output map only "
                                  f"once for ensemble '{name}' step {i}")
            meet(tensor)
            written.add(tensor)
            outputs.append(tensor)
        for tensor in step.input_map.values():
            meet(tensor)
            for out in outputs:
                sources[out].add(tensor)
                readers[tensor].add(out)
    ready: set[str] = set()
    queue: list[str] = []
    for inp in proto.input:
        if inp.name not in readers:
            raise ConfigError(f"ensemble input '{inp.name}' for ensemble {name}' is not used")
        ready.add(inp.name)
        queue.append(inp.name)
    while queue:
        for nxt in sorted(readers[queue.pop(0)]):
            if nxt not in ready and sources[nxt] <= ready:
                ready.add(nxt)
                queue.append(nxt)
    outputs_ok: set[str] = set()
    for t in proto.output:
        if t.name not in readers:
            raise ConfigError(f"ensemble output '{t.name}' for ensemble {name}' is not used")
        if t.name not in ready:
            message = f"output '{t.name}' for ensemble '{name}' is not written"
            # follow not-ready sources back to the first one that never becomes ready
            last, seen, current = t.name, set(), sources[t.name]
            while current:
                found = next((n for n in sorted(current) if n not in ready and n not in seen),
                             None)
                if found is None:
                    break
                seen.add(found)
                last, current = found, sources[found]
            if last != t.name:
                message += f": at least one of its depending tensors, '{last}', is not connected"
            raise ConfigError(message)
        outputs_ok.add(t.name)
    for tensor in tensors:
        if tensor not in outputs_ok and (tensor not in ready or not readers[tensor]):
            raise ConfigError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def validate_model_io(proto: pb.ModelConfig, where: str = "") -> None:
    """Triton's ValidateModelIOConfig: every input and output, then the batch inputs and
    outputs; the message ends "for <model>"."""
    prefix = f"{where}: " if where else ""
    try:
        for tensor in proto.input:
            _check_io(tensor, proto.max_batch_size, "model input ")
            if (tensor.format in (pb.ModelInputFormat.FORMAT_NHWC, pb.ModelInputFormat.FORMAT_NCHW)
                    and len(tensor.dims) != 3):
                raise ConfigError("model input NHWC/NCHW require 3 dims")
            if tensor.is_shape_tensor and proto.platform != "tensorrt_plan":
                raise ConfigError("shape tensors are only supported for TensorRT platform")
        for output in proto.output:
            _check_io(output, proto.max_batch_size, "model output ")
            if output.is_shape_tensor and proto.platform != "tensorrt_plan":
                raise ConfigError("shape tensors are only supported for TensorRT platform")
        _check_batch_io(proto)
    except ConfigError as exc:
        raise ConfigError(f"{prefix}{exc} for {proto.name}") from None


def _check_io(io: pb.ModelInput | pb.ModelOutput, max_batch_size: int, prefix: str) -> None:
    if not io.name:
        raise ConfigError(f"{prefix}must specify 'name'")
    label = f"{prefix}'{io.name}' "
    if io.data_type == pb.DataType.TYPE_INVALID:
        raise ConfigError(f"{label}must specify 'data_type'")
    if not io.dims:
        raise ConfigError(f"{label}must specify 'dims'")
    has_reshape = _present(io, "reshape")
    shape = list(io.reshape.shape) if has_reshape else []
    if has_reshape and not shape and max_batch_size == 0:
        raise ConfigError(f"{label}cannot have empty reshape for non-batching model as scalar "
                          "tensors are not supported")
    if any(d < 1 and d != WILDCARD for d in io.dims):
        raise ConfigError(f"{label}dimension must be integer >= 1, or -1 to indicate a "
                          "variable-size dimension")
    if not has_reshape:
        return
    if any(d < 1 and d != WILDCARD for d in shape):
        raise ConfigError(f"{label}reshape dimensions must be integer >= 1, or -1 to indicate "
                          "a variable-size dimension")
    dims_count, reshape_count = _element_count(io.dims), _element_count(shape)
    # an empty reshape stands for a single element
    if dims_count != reshape_count and not (reshape_count == 0 and dims_count == 1):
        raise ConfigError(f"{label}has different size for dims and reshape")
    if dims_count == WILDCARD:
        # the runs of fixed dimensions between variable ones must hold equal element counts
        dims_runs, reshape_runs = _runs(io.dims), _runs(shape)
        if len(dims_runs) != len(reshape_runs):
            raise ConfigError(f"{label}has different number of variable-size dimensions for "
                              "dims and reshape")
        if dims_runs != reshape_runs:
            raise ConfigError(f"{label}has different size for dims and reshape")


def _element_count(dims: list[int]) -> int:
    """Elements in a shape; -1 when a dimension is variable, 0 for an empty shape."""
    if not dims:
        return 0
    count = 1
    for d in dims:
        if d == WILDCARD:
            return WILDCARD
        count *= d
    return count


def _runs(dims: list[int]) -> list[int]:
    """The element counts of the fixed runs a variable dimension separates."""
    runs, current = [], 1
    for d in dims:
        if d == WILDCARD:
            runs.append(current)
            current = 1
        else:
            current *= d
    runs.append(current)
    return runs


def _check_batch_io(proto: pb.ModelConfig) -> None:
    inputs = {t.name for t in proto.input}
    outputs = {t.name for t in proto.output}
    for batch in proto.batch_input:
        kind = pb.BatchInputKind(batch.kind).name
        if len(batch.source_input) != 1:
            raise ConfigError(f"batch input kind '{kind}' expects 1 source input, got "
                              f"{len(batch.source_input)}")
        if batch.data_type not in (pb.DataType.TYPE_INT32, pb.DataType.TYPE_FP32):
            raise ConfigError("batch input data type must be TYPE_INT32 or TYPE_FP32")
        for source in batch.source_input:
            if source not in inputs:
                raise ConfigError(f"unknown source input name '{source}'")
    for out in proto.batch_output:
        kind = pb.BatchOutputKind(out.kind).name
        if len(out.source_input) != 1:
            raise ConfigError(f"batch output kind '{kind}' expects 1 source input, got "
                              f"{len(out.source_input)}")
        for source in out.source_input:
            if source not in inputs:
                raise ConfigError(f"unknown source input name '{source}'")
        targets: set[str] = set()
        for target in out.target_name:
            if target not in outputs:
                raise ConfigError(f"unknown target output name '{target}'")
            if target in targets:
                raise ConfigError(f"target output name '{target}' can only be specified once")
            targets.add(target)
