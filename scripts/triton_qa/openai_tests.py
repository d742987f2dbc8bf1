"""Triton's own OpenAI-frontend tests (``python/openai/tests`` of the server repository) against
nursery, unchanged.

    python scripts/triton_qa/openai_tests.py --triton-server /tmp/triton-server \\
        --work /tmp/nursery-oai [--venv /tmp/oai-venv] [TEST_FILE ...]

Two kinds of test are in that folder, and both run here:

- the ones that start the frontend as a program (``OpenAIServer``: ``python3
  openai_frontend/main.py <flags>``): the harness puts a stand-in ``main.py`` in the copied
  ``openai_frontend`` folder that replaces itself with ``python -m nursery openai <flags>``, so
  the tests drive nursery's OpenAI port with the frontend's command line;
- the ones that run Triton's FastAPI frontend in-process on ``tritonserver.Server``
  (``setup_server``): they run Triton's own frontend code on nursery's ``tritonserver``
  package.

With ``--triton-frontend`` the stand-in is left out: the tests start Triton's own frontend
program (FastAPI and uvicorn, in the test venv, ``python3`` on the ``PATH`` being the venv's),
which runs on nursery's ``tritonserver`` and ``tritonfrontend`` packages.

The tests' models are their own (``tests/test_models``: ``mock_llm``, ``identity_py``, Python
models); the files that need vLLM or TensorRT-LLM and their LLM weights (chat, completions,
embeddings, tool calling and LoRA with a real model) are not run by default. The test
environment is a venv (made on first use, ``--venv``) that sees the system's packages (nursery's
own) with the frontend's pinned requirements installed over them (FastAPI, httpx, openai,
transformers for its tokenizer code). ``TEST_BACKEND=vllm``, ``TEST_MODEL=mock_llm``,
``TEST_MODEL_REPOSITORY`` the tests' models and ``TEST_TOKENIZER`` a tokenizer folder written
here (tests/llm_tokenizer.py) choose the fixtures. Ports 8000, 8001 and 9000 must be free (the
tests use them). Nothing is fetched at test time beyond the venv's first installation.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FILES = ["test_model_management.py", "test_openai_restricted_apis.py",
                 "test_observability.py", "test_request_size.py"]
# the frontend's own pins (python/openai/requirements*.txt) and what its modules import
REQUIREMENTS = ["pytest==8.1.1", "pytest-asyncio==0.23.8", "fastapi==0.121.2", "httpx==0.27.2",
                "openai==1.107.3", "partial-json-parser", "requests", "uvicorn", "transformers"]

STAND_IN = textwrap.dedent('''\
    """Stand-in for Triton's OpenAI frontend (written by nursery's harness): runs nursery
    under the frontend's command line."""
    import os
    import sys

    env = {{**os.environ, "PYTHONPATH": {root!r}}}
    os.execve({python!r}, [{python!r}, "-m", "nursery", "openai", *sys.argv[1:]], env)
    ''')


def prepare(triton_server: Path, work: Path, stand_in: bool) -> None:
    """The frontend and its tests copied into ``work``, the stand-in in place (unless Triton's
    own frontend is to run), a tokenizer."""
    source = triton_server / "python" / "openai"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for part in ("openai_frontend", "tests"):
        shutil.copytree(source / part, work / part)
    if stand_in:
        (work / "openai_frontend" / "main.py").write_text(
            STAND_IN.format(root=str(ROOT), python=sys.executable))
    sys.path.insert(0, str(ROOT))
    from tests.llm_tokenizer import write_tokenizer

    write_tokenizer(work / "tokenizer")


def venv(path: Path) -> Path:
    """The test environment's Python (made once: the system's packages plus the pins)."""
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)],
                       check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True)
    return python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--triton-server", type=Path, required=True,
                        help="a checkout of triton-inference-server/server")
    parser.add_argument("--work", type=Path, default=Path("/tmp/nursery-oai"))
    parser.add_argument("--venv", type=Path, default=Path("/tmp/oai-venv"))
    parser.add_argument("--triton-frontend", action="store_true",
                        help="run Triton's own frontend program on nursery's tritonserver "
                        "package instead of `python -m nursery openai`")
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES,
                        help=f"test files of python/openai/tests (default: {DEFAULT_FILES})")
    args = parser.parse_args()
    prepare(args.triton_server, args.work, stand_in=not args.triton_frontend)
    python = venv(args.venv)
    path = os.environ.get("PATH", "")
    if args.triton_frontend:  # the tests start `python3 main.py`: the venv's python3
        wrapper = args.work / "bin" / "python3"
        wrapper.parent.mkdir()
        wrapper.write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
        wrapper.chmod(0o755)
        path = os.pathsep.join([str(wrapper.parent), path])
    env = {**os.environ, "PATH": path,
           "TEST_BACKEND": "vllm", "TEST_MODEL": "mock_llm",
           "TEST_MODEL_REPOSITORY": str(args.work / "tests" / "test_models"),
           "TEST_TOKENIZER": str(args.work / "tokenizer"),
           "PYTHONPATH": os.pathsep.join([str(args.work / "openai_frontend"), str(args.work),
                                          str(ROOT)])}
    return subprocess.run([str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rf",
                           *[f"tests/{f}" for f in args.files]],
                          cwd=args.work, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
