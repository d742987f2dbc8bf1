"""An ensemble's wiring checked against the configurations of the models it is made of: each
step's tensors exist on its model, each ensemble tensor has one datatype along the graph, and
no step (nor the ensemble's answer) mixes tensors from different decoupled steps.

An ensemble's transaction policy is not its own to choose: Triton's ``ValidateEnsembleConfig``
sets it, overriding ``model_transaction_policy``, to decoupled exactly when a step's model is
decoupled (then each of that step's responses runs the steps after it once more, and the
ensemble answers as a stream); :func:`check_wiring` says which, and the manager serves the
ensemble so."""

from __future__ import annotations

from collections.abc import Sequence

from nursery.config.model import ModelConfig
from nursery.errors import ConfigError


def check_wiring(config: ModelConfig, step_models: Sequence[ModelConfig]) -> bool:
    """``step_models[i]`` is the configuration of the model step ``i`` runs. Raises
    :class:`ConfigError` naming the step, the model and the tensor; returns whether the
    ensemble is decoupled (some step's model is)."""
    plan = config.ensemble
    assert plan is not None
    where = f"ensemble '{config.name}'"
    types = {t.name: t.datatype for t in config.inputs}
    types.update((t.name, t.datatype) for t in config.outputs)
    for i, (step, model) in enumerate(zip(plan.steps, step_models, strict=True)):
        label = f"{where} step {i}"
        for what, mapping, specs in (("input", step.input_map, model.input_map),
                                     ("output", step.output_map, model.output_map)):
            for tensor_name, ensemble_tensor in mapping.items():
                spec = specs.get(tensor_name)
                if spec is None:
                    raise ConfigError(
                        f"{label}: model '{model.name}' has no {what} '{tensor_name}' "
                        f"(it has: {', '.join(sorted(specs))})")
                seen = types.setdefault(ensemble_tensor, spec.datatype)
                if seen is not spec.datatype:
                    raise ConfigError(
                        f"{label}: ensemble tensor '{ensemble_tensor}' is {seen.value} "
                        f"elsewhere but {what} '{tensor_name}' of model '{model.name}' is "
                        f"{spec.datatype.value}")
        for spec in model.inputs:  # Triton's rule: only an optional input may be left unmapped
            if spec.name not in step.input_map and not spec.optional:
                raise ConfigError(
                    f"{label}: input '{spec.name}' of model '{model.name}' is not mapped to any "
                    "ensemble tensor (only an optional input may be left out of 'input_map')")
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
