"""An ensemble's wiring checked against the configurations of the models it is made of: each
step's tensors exist on its model, and each ensemble tensor has one datatype along the graph."""

from __future__ import annotations

from collections.abc import Sequence

from nursery.config.model import ModelConfig
from nursery.errors import ConfigError


def check_wiring(config: ModelConfig, step_models: Sequence[ModelConfig]) -> None:
    """``step_models[i]`` is the configuration of the model step ``i`` runs. Raises
    :class:`ConfigError` naming the step, the model and the tensor."""
    plan = config.ensemble
    assert plan is not None
    where = f"ensemble '{config.name}'"
    types = {t.name: t.datatype for t in config.inputs}
    types.update((t.name, t.datatype) for t in config.outputs)
    for i, (step, model) in enumerate(zip(plan.steps, step_models, strict=True)):
        label = f"{where} step {i}"
        if model.decoupled and not config.decoupled:
            raise ConfigError(
                f"{label}: model '{model.name}' is decoupled, so the ensemble must be too: "
                f"add 'model_transaction_policy {{ decoupled: true }}' to ensemble "
                f"'{config.name}' (its responses then come as a stream, over gRPC "
                "ModelStreamInfer)")
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
