"""What Triton's test container gives its Python clients and this machine's Python does not,
restored for the clients only (this folder is on their PYTHONPATH, never on the server's):

- ``np.NINF``: Triton's container pins NumPy 1; NumPy 2 removed the alias (L0_nan_inf's
  client builds its expected answer with it; numpy1/nursery_qa_numpy1.py, which the
  stand-in also puts on the server's PYTHONPATH for Triton's Python models).
- ``pkg_resources``: ``tritonclient.utils.shared_memory`` (2.41) finds its ``libcshm.so``
  with ``pkg_resources.resource_filename``, and setuptools 81 and later no longer ship
  ``pkg_resources`` (every L0_shared_memory case stopped at that import). When the real module
  is missing, a stand-in answers ``resource_filename`` from the package's own folder, which
  is what the real one returns for an installed package; anything else it is asked fails.

nursery itself needs neither."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path


def _resource_filename(package: str, name: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"nursery-qa pkg_resources stand-in: no package {package!r}")
    return str(Path(list(spec.submodule_search_locations)[0]) / name)


def _pkg_resources_stand_in() -> None:
    if importlib.util.find_spec("pkg_resources") is not None:
        return
    module = types.ModuleType("pkg_resources", "nursery-qa stand-in (see client_env.py)")
    module.resource_filename = _resource_filename  # type: ignore[attr-defined]

    def missing(attr: str) -> object:
        raise AttributeError(f"nursery-qa pkg_resources stand-in has only resource_filename, "
                             f"not {attr!r}")

    module.__getattr__ = missing  # type: ignore[method-assign]
    sys.modules["pkg_resources"] = module


def install() -> None:
    _pkg_resources_stand_in()
    sys.path.append(str(Path(__file__).resolve().parent / "numpy1"))
    import nursery_qa_numpy1

    nursery_qa_numpy1.install()
