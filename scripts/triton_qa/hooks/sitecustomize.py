"""Loaded by every Python the qa harness starts for Triton's test clients (see qa_record.py)."""
import os

import client_env

client_env.install()

if os.environ.get("NURSERY_QA_RECORD"):
    import qa_record

    qa_record.install_unittest()


class _OpenVinoRuntimeAlias:
    """Triton's model generators import ``openvino.runtime``, which OpenVINO 2025+ removed (its
    API moved to ``openvino`` itself): that name is answered with ``openvino`` when the
    installed release has no such module, so `gen_qa_models.py --openvino` runs here."""

    def find_spec(self, name, path=None, target=None):
        if name != "openvino.runtime":
            return None
        import importlib.machinery
        import importlib.util

        sys.meta_path.remove(self)
        try:
            if importlib.util.find_spec("openvino.runtime") is not None:
                return None  # an older release: its own module
        except ImportError:
            return None
        finally:
            sys.meta_path.insert(0, self)
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        return None  # the default: a new module, filled below

    def exec_module(self, module):
        import openvino

        module.__getattr__ = lambda attr: getattr(openvino, attr)  # PEP 562


import sys  # noqa: E402

sys.meta_path.insert(0, _OpenVinoRuntimeAlias())
