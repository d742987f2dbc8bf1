"""Per-model Python environments: Triton's ``EXECUTION_ENV_PATH`` model parameter.

The parameter names a packed environment (a ``.tar.gz`` made by ``conda-pack`` or ``tar`` of a
venv) or an environment folder; ``$$TRITON_MODEL_DIRECTORY`` stands for the model's folder.
The model's stub processes then run under that environment's interpreter
(``<env>/bin/python``), with its site-packages first and the server's after (nursery and its
own dependencies come from the server). As with Triton, the environment's Python must be the
server's version when it holds compiled packages. An archive is unpacked once per content
(its size and mtime) into a cache folder beside the system's temporary files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import threading
from pathlib import Path

from nursery.config.model import ModelConfig
from nursery.errors import ConfigError

PARAMETER = "EXECUTION_ENV_PATH"
_unpacking = threading.Lock()


def environment_path(config: ModelConfig) -> Path | None:
    """The model's environment as a path (``$$TRITON_MODEL_DIRECTORY`` replaced), or None."""
    raw = str(config.parameters.get(PARAMETER, "")).strip()
    if not raw:
        return None
    return Path(raw.replace("$$TRITON_MODEL_DIRECTORY", str(config.path)))


def interpreter(config: ModelConfig, env: Path) -> Path:
    """The Python that runs this model's stubs: ``<env>/bin/python`` of the folder, or of the
    archive once unpacked. Raises :class:`ConfigError` with what is wrong."""
    return interpreter_for(config.name, env)


def interpreter_for(model_name: str, env: Path) -> Path:
    """:func:`interpreter` by the model's name."""
    where = f"model '{model_name}': {PARAMETER} '{env}'"
    if not env.exists():
        raise ConfigError(f"{where} does not exist")
    folder = env if env.is_dir() else _unpacked(env, where)
    python = folder / "bin" / "python"
    if not python.exists():
        python = folder / "bin" / "python3"
    if not python.exists():
        raise ConfigError(f"{where} holds no bin/python: not a Python environment")
    return python


def _unpacked(archive: Path, where: str) -> Path:
    stat = archive.stat()
    key = hashlib.sha256(f"{archive.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    target = Path(tempfile.gettempdir()) / "nursery-envs" / key.hexdigest()[:24]
    with _unpacking:
        if (target / ".unpacked").exists():
            return target
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(partial, filter="tar")
        except (tarfile.TarError, OSError, EOFError) as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise ConfigError(f"{where} cannot be unpacked: {exc}") from None
        unpack = partial / "bin" / "conda-unpack"
        if unpack.exists():  # conda-pack's fix-up of the prefixes baked into the files
            subprocess.run([str(unpack)], cwd=partial, check=False, capture_output=True)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        (target / ".unpacked").touch()
    return target


# The stub's module. Its name is Triton's stub executable's, so what finds Triton's stubs by
# their command line (`pgrep -f triton_python_backend_stub`, as Triton's own tests do) finds
# nursery's: `python -m nursery.backends.python.triton_python_backend_stub <fd> <instance>`.
STUB_MODULE = "nursery.backends.python.triton_python_backend_stub"

# A stub under an environment's interpreter starts with this: the server's site-packages go
# at the END of sys.path (after the environment's own), then the stub module runs.
BOOTSTRAP = (
    "import os, runpy, sys; "
    "sys.path.extend(p for p in os.environ.get('NURSERY_STUB_FALLBACK', '').split(os.pathsep)"
    " if p); "
    "sys.argv = ['nursery-stub', *sys.argv[1:]]; "
    f"runpy.run_module('{STUB_MODULE}', run_name='__main__')"
)


def fallback_path() -> str:
    """The server's site-packages, for a stub under another interpreter (after its own)."""
    paths = sysconfig.get_paths()
    server = [p for p in dict.fromkeys((paths["purelib"], paths["platlib"])) if p]
    extra = [p for p in sys.path if p.endswith("site-packages") and p not in server]
    return os.pathsep.join([*server, *extra])
