"""``np.NINF``, which NumPy 2 removed, restored once numpy is imported: Triton's container pins
NumPy 1, and Triton's L0_nan_inf uses the alias in its client and in its Python model
(``nan_inf_output``). Only that name is restored, the one Triton's qa/ uses; numpy itself is
not imported here."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types


def _alias(numpy: types.ModuleType) -> None:
    if not hasattr(numpy, "NINF"):
        numpy.NINF = -numpy.inf  # type: ignore[attr-defined]


class _NumpyAliases(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if name != "numpy":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("numpy")
        if spec is None or spec.loader is None:
            return spec
        original = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            original(module)
            _alias(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    if "numpy" in sys.modules:
        _alias(sys.modules["numpy"])
    else:
        sys.meta_path.insert(0, _NumpyAliases())
