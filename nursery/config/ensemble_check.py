"""An ensemble's wiring checked against the configurations of the models it is made of: each
step's tensors exist on its model, each ensemble tensor has one datatype and one shape along
the graph, and no step (nor the ensemble's answer) mixes tensors from different decoupled
steps.

An ensemble's transaction policy is not its own to choose: Triton's ``ValidateEnsembleConfig``
sets it, overriding ``model_transaction_policy``, to decoupled exactly when a step's model is
decoupled (then each of that step's responses runs the steps after it once more, and the
ensemble answers as a stream); :func:`check_wiring` says which, and the manager serves the
ensemble so."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nursery.config.model import ModelConfig, TensorSpec
from nursery.errors import ConfigError
from nursery.types import DataType


@dataclass(frozen=True, slots=True)
class _Node:
    """What one model (or the ensemble itself) says an ensemble tensor is."""
    datatype: DataType
    dims: tuple[int, ...]
    batching: bool
    model: str

    @property
    def full_dims(self) -> tuple[int, ...]:
        return (-1, *self.dims) if self.batching else self.dims

    def conflict(self, other: _Node) -> str:
        """Triton's ValidateTensorConsistency: one datatype, and shapes equal up to variable
        (-1) dims, compared as configured or else with the batch dim prepended (a tensor
        between a non-batching model's [-1, d...] and a batching model's [d...]). The
        problem in Triton's words, or ''."""
        if self.datatype is not other.datatype:
            return (f"inconsistent data type: {self.datatype.config_name} is inferred from "
                    f"model {self.model} while {other.datatype.config_name} is inferred from "
                    f"model {other.model}")
        if not (_same_dims(self.dims, other.dims)
                or _same_dims(self.full_dims, other.full_dims)):
            return (f"inconsistent shape: {_dims_text(self.full_dims)} is inferred from model "
                    f"{self.model} while {_dims_text(other.full_dims)} is inferred from model "
                    f"{other.model}")
        return ""


def _same_dims(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, dims)) + "]"


def check_wiring(config: ModelConfig, step_models: Sequence[ModelConfig]) -> bool:
    """``step_models[i]`` is the configuration of the model step ``i`` runs. Raises
    :class:`ConfigError` naming the step, the model and the tensor; returns whether the
    ensemble is decoupled (some step's model is)."""
    plan = config.ensemble
    assert plan is not None
    name = config.name
    # each ensemble tensor's datatype and shape, and the model they were first inferred from
    # (Triton's ValidateEnsembleConfig and ValidateTensorMapping, their order and words)
    batching = config.max_batch_size > 0
    tensors = {t.name: _Node(t.datatype, t.reshape if t.reshape is not None else t.dims,
                             batching, name)
               for t in (*config.inputs, *config.outputs)}

    def consistent(tensor: str, spec: TensorSpec, model: ModelConfig) -> None:
        node = _Node(spec.datatype, spec.dims, model.max_batch_size > 0, model.name)
        seen = tensors.setdefault(tensor, node)
        problem = seen.conflict(node)
        if problem:
            raise ConfigError(f"in ensemble {name}, ensemble tensor {tensor}: {problem}")

    for step, model in zip(plan.steps, step_models, strict=True):
        if 0 < model.max_batch_size < config.max_batch_size:
            raise ConfigError(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                f"contains model {model.name} which only allows maximum batch size to be "
                f"{model.max_batch_size}")
        for tensor_name, ensemble_tensor in step.input_map.items():
            if tensor_name not in model.input_map:
                raise ConfigError(
                    f"in ensemble {name}, ensemble tensor {ensemble_tensor} is mapping to "
                    f"non-existing input {tensor_name} in model {model.name} (model "
                    f"'{model.name}' has no input '{tensor_name}'; it has: "
                    f"{', '.join(sorted(model.input_map))})")
        for spec in model.inputs:  # only an optional input may be left unmapped
            if spec.name in step.input_map:
                consistent(step.input_map[spec.name], spec, model)
            elif not spec.optional:
                raise ConfigError(
                    f"in ensemble {name}, input {spec.name} in model {model.name} is not "
                    "mapped to any ensemble tensors")
        for tensor_name, ensemble_tensor in step.output_map.items():
            produced = model.output_map.get(tensor_name)
            if produced is None:
                raise ConfigError(
                    f"in ensemble {name}, ensemble tensor {ensemble_tensor} is mapped from "
                    f"non-existing output {tensor_name} in model {model.name} (model "
                    f"'{model.name}' has no output '{tensor_name}'; it has: "
                    f"{', '.join(sorted(model.output_map))})")
            consistent(ensemble_tensor, produced, model)
    return _decoupled_sources(config, step_models)


def _decoupled_sources(config: ModelConfig, step_models: Sequence[ModelConfig]) -> bool:
    """Label every ensemble tensor with the decoupled step it descends from (0: none), in
    step order from the inputs, as Triton does; a step reading tensors of two labels (or
    ensemble outputs of two labels) cannot pair their responses and is refused with Triton's
    message. True when some step is decoupled."""
    plan = config.ensemble
    assert plan is not None
    label = dict.fromkeys(plan.inputs, 0)
    flow = plan.start()
    decoupled = 0
    while ready := flow.take_ready():
        for i in ready:
            step, model = plan.steps[i], step_models[i]
            sources = {label[t] for t in step.input_map.values()}
            if len(sources) > 1:
                raise ConfigError(
                    f"in ensemble {config.name}, step of model '{model.name}' receives inputs "
                    "originated from different decoupled models")
            source = sources.pop() if sources else 0
            if model.decoupled:
                decoupled += 1
                source = decoupled
            label.update(dict.fromkeys(step.output_map.values(), source))
            flow.finished(i)
    if len({label[t] for t in plan.outputs}) > 1:
        raise ConfigError(
            f"in ensemble {config.name}, step of model '{config.name}' receives inputs "
            "originated from different decoupled models")
    return decoupled > 0
