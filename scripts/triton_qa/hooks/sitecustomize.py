"""Loaded by every Python the qa harness starts for Triton's test clients (see qa_record.py)."""
import os

import client_env

client_env.install()

if os.environ.get("NURSERY_QA_RECORD"):
    import qa_record

    qa_record.install_unittest()
