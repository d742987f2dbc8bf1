"""``tritonclient.utils.shared_memory`` / ``cuda_shared_memory``, importable here.

tritonclient 2.41's shared-memory helpers import ``pkg_resources`` only to find their own
``libcshm.so`` (``resource_filename``); setuptools 81+ no longer ships ``pkg_resources``. When
it is missing, a stand-in with that one function (over ``importlib.resources``) is installed
before the import. Nothing else of tritonclient is touched.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import sys
import types


def _install_pkg_resources_shim() -> None:
    if "pkg_resources" in sys.modules or importlib.util.find_spec("pkg_resources") is not None:
        return
    shim = types.ModuleType("pkg_resources")

    def resource_filename(package: str, resource: str) -> str:
        return str(importlib.resources.files(package) / resource)

    shim.resource_filename = resource_filename  # type: ignore[attr-defined]
    sys.modules["pkg_resources"] = shim


_install_pkg_resources_shim()

import tritonclient.utils.shared_memory as system_shm  # noqa: E402


def cuda_shm() -> types.ModuleType:
    """``tritonclient.utils.cuda_shared_memory`` (needs CUDA; imported on demand)."""
    import tritonclient.utils.cuda_shared_memory as module

    return module


__all__ = ["system_shm", "cuda_shm"]
