"""The backend contract and the registry of backends by name.

A backend has two halves. The *factory* (one per backend kind, stateless) knows the default
model file name and can auto-complete a configuration from the model file. The *instance*
(one per model instance) is created and used only on its instance worker's own thread:
``load`` builds it there, ``execute`` runs one batch there, ``close`` finalizes it there.
"""

from __future__ import annotations

import copy
import importlib
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, Self

import numpy as np

from nursery.config.model import ModelConfig
from nursery.errors import ConfigError
from nursery.runtime.devices import InstancePlacement
from nursery.schema import inference as pb

log = logging.getLogger("nursery.backends")


class BackendInstance(Protocol):
    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run one batch; return the requested outputs by name."""
        ...

    def close(self) -> None: ...


class BackendFactory(Protocol):
    name: str  # the config's ``backend`` value, e.g. "onnxruntime"
    platform: str  # the matching ``platform`` value, e.g. "onnxruntime_onnx" ("" if none)
    default_filename: str  # e.g. "model.onnx"

    def auto_complete(self, config: pb.ModelConfig, version_path: Path) -> None:
        """Fill what the model file can tell (inputs, outputs, max_batch_size) into ``config``."""
        ...

    def load(
        self, config: ModelConfig, version_path: Path, placement: InstancePlacement
    ) -> BackendInstance:
        """Create one instance. Called on the instance's own thread."""
        ...


PYTHON_BASED_SCRIPT = "model.py"  # <backend directory>/<name>/model.py is backend <name>

# backend name -> module exposing FACTORY; imported lazily so that a missing optional
# package (torch, tensorrt) only matters to the models that use it.
_MODULES = {
    "fil": "nursery.backends.fil",
    "onnxruntime": "nursery.backends.onnxruntime",
    "openvino": "nursery.backends.openvino",
    "python": "nursery.backends.python.backend",
    "pytorch": "nursery.backends.pytorch",
    "tensorflow": "nursery.backends.tensorflow",
    "tensorrt": "nursery.backends.tensorrt",
}


def drop_bogus_module() -> None:
    """Make harmless the module named '' that serializing a message with betterproto's Rust
    codec puts in ``sys.modules`` (the working directory, as a package without a file):
    libraries that walk ``sys.modules`` through ``inspect.getmodule`` fail on a module without
    a file (torch, at import: "<module ''> is a built-in module", then "partially initialized
    module 'torch'"). It gets a ``__file__`` that names no file, which inspect passes over; it
    is not removed, as the codec looks it up again on other threads. Called before a backend
    or a model file imports such libraries."""
    bogus = sys.modules.get("")
    if bogus is not None and getattr(bogus, "__name__", None) == "" and not getattr(
            bogus, "__file__", None):
        bogus.__file__ = "<betterproto-rust-codec>"


def missing_extra(model: str, backend: str, extra: str, exc: ImportError) -> ConfigError:
    """A model's load failure when its backend's packages are not installed: one line that
    names the extra to install."""
    return ConfigError(f"model '{model}': the {backend} backend needs the '{extra}' extra "
                       f"(pip install 'nursery[{extra}]'): {exc}")


# Triton's words for a backend it cannot find (backend_model.cc), first in nursery's message
_NOT_FOUND = ("unable to find backend library for backend '{backend}', try specifying runtime "
              "on the model configuration.")


def get_factory(backend: str, model_name: str) -> BackendFactory:
    """The built-in backend named ``backend`` (its module imported on first use)."""
    module_name = _MODULES.get(backend)
    if module_name is None:
        raise ConfigError(
            f"{_NOT_FOUND.format(backend=backend)} (model '{model_name}': backend '{backend}' "
            f"is not available in this server; available: {', '.join(sorted(_MODULES))})"
        )
    module = importlib.import_module(module_name)
    factory: BackendFactory = module.FACTORY
    return factory


DEFAULT_MAX_BATCH_SIZE_SETTING = "default-max-batch-size"
DEFAULT_MAX_BATCH_SIZE = 4  # Triton's core default for the setting


def default_max_batch_size(settings: Mapping[str, str], backend: str) -> int:
    """The ``default-max-batch-size`` a backend's auto-complete gives a model that can batch
    and whose configuration says no ``max_batch_size`` (0 turns batching off)."""
    value = settings.get(DEFAULT_MAX_BATCH_SIZE_SETTING, str(DEFAULT_MAX_BATCH_SIZE)).strip()
    try:
        size = int(value)
    except ValueError:
        size = -1
    if size < 0:
        raise ConfigError(f"--backend-config={backend},{DEFAULT_MAX_BATCH_SIZE_SETTING}: a "
                          f"non-negative integer, not '{value}'")
    return size


class AutofillsBatching:
    """For factories whose auto-complete turns batching on for a model that can batch: the
    ``default-max-batch-size`` it then gives (``--backend-config``; 0 leaves batching off)."""

    name: str
    default_max_batch: int = DEFAULT_MAX_BATCH_SIZE

    def configured(self, settings: Mapping[str, str]) -> Self:
        out = copy.copy(self)
        out.default_max_batch = default_max_batch_size(settings, self.name)
        return out


class Backends:
    """The backends one server can load, by name: the built-in ones and those an embedder or
    a test adds (``Backends({"fake": factory})``). Called like :func:`get_factory`.

    ``settings`` is ``--backend-config`` by backend, ``""`` for the settings every backend
    gets. A backend's settings are Triton's ResolveBackendConfigs: the global ones, overridden
    by its own, then ``default-max-batch-size`` (4) when neither gives it. A factory with a
    ``configured(settings)`` method gets them; the first time a backend is asked for, the
    verbose log shows them as Triton's does ("backend configuration:" and its JSON)."""

    def __init__(self, extra: Mapping[str, BackendFactory] | None = None,
                 settings: Mapping[str, Mapping[str, str]] | None = None,
                 directory: Path | None = None) -> None:
        self._extra = dict(extra or {})
        self._settings = {b: dict(s) for b, s in (settings or {}).items()}
        self._directory = directory  # --backend-directory: Python-based backends

    def resolved(self, backend: str) -> dict[str, str]:
        """The settings ``backend`` gets (Triton's ResolveBackendConfigs, then its defaults)."""
        out = {**self._settings.get("", {}), **self._settings.get(backend, {})}
        if DEFAULT_MAX_BATCH_SIZE_SETTING in out:
            log.debug("Found overwritten default setting: %s,%s", DEFAULT_MAX_BATCH_SIZE_SETTING,
                      out[DEFAULT_MAX_BATCH_SIZE_SETTING])
        else:
            log.debug("Adding default backend config setting: %s,%d",
                      DEFAULT_MAX_BATCH_SIZE_SETTING, DEFAULT_MAX_BATCH_SIZE)
            out[DEFAULT_MAX_BATCH_SIZE_SETTING] = str(DEFAULT_MAX_BATCH_SIZE)
        return out

    def __call__(self, backend: str, model_name: str) -> BackendFactory:
        found = self._extra.get(backend)
        if found is not None:
            return found
        if backend not in _MODULES and self._directory is not None:
            script = self._directory / backend / PYTHON_BASED_SCRIPT
            if script.is_file():  # a Python-based backend, as Triton finds one
                python = self("python", model_name)
                based: BackendFactory = python.python_based(  # type: ignore[attr-defined]
                    backend, script)
                self._extra[backend] = based
                return based
        if backend in _MODULES:
            factory = get_factory(backend, model_name)
            settings = self.resolved(backend)
            log.debug("backend configuration:\n%s", json.dumps({"cmdline": settings}))
            configure = getattr(factory, "configured", None)
            if configure is not None:  # a backend that reads --backend-config
                factory = configure(settings)
            self._extra[backend] = factory  # resolved once, as Triton initializes a backend once
            return factory
        if backend not in _MODULES and (self._extra or self._directory is not None):
            known = ", ".join(sorted({*_MODULES, *self._extra}))
            searched = ("" if self._directory is None else
                        f"; no Python-based backend at "
                        f"'{self._directory / backend / PYTHON_BASED_SCRIPT}'")
            raise ConfigError(
                f"{_NOT_FOUND.format(backend=backend)} (model '{model_name}': backend "
                f"'{backend}' is not available in this server; available: {known}{searched})"
            )
        return get_factory(backend, model_name)
