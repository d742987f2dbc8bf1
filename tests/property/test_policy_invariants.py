"""Every scheduling policy, built in or yours, against the scheduling contract.

Runs ``tests/property/policy_invariants.py`` for each policy the simulator knows by name.
To prove your own policy (see docs/research.md)::

    NURSERY_POLICY=mypkg.mymodule:MyPolicy python -m pytest tests/property/test_policy_invariants.py

(``NURSERY_POLICY_TIMEOUTS=1`` also checks that it rejects expired requests as Triton does.)
"""

from __future__ import annotations

import os
import re
import types

from nursery.simulate import policies
from tests.conftest import ROOT
from tests.property.policy_invariants import default_settings, policy_machine

HONOURS_TIMEOUTS = {"fifo": False, "dynamic": True, "adaptive": True, "edf": True}

for _name, _factory in policies.BUILTIN.items():
    if _name not in HONOURS_TIMEOUTS:  # needs a model's config (sequence): its own tests
        continue
    _test = policy_machine(_factory, honours_timeouts=HONOURS_TIMEOUTS[_name],
                           name=_name.title()).TestCase
    _test.settings = default_settings(60)
    globals()[f"Test{_name.title()}Contract"] = _test
del _test  # unittest classes are collected under any name


def _docs_example() -> type:
    """The policy docs/research.md teaches with, so that the example stays correct."""
    text = (ROOT / "docs" / "research.md").read_text()
    match = re.search(r"```python\n(# mypkg/lifo.py.*?)```", text, re.S)
    assert match, "docs/research.md lost its example policy"
    module = types.ModuleType("docs_lifo")
    exec(compile(match.group(1), "docs/research.md", "exec"), module.__dict__)  # noqa: S102
    return module.LifoPolicy  # type: ignore[no-any-return]


TestDocsExampleContract = policy_machine(_docs_example().from_config, name="Docs").TestCase
TestDocsExampleContract.settings = default_settings(30)

_extra = os.environ.get("NURSERY_POLICY")
if _extra:
    _test = policy_machine(policies.resolve(_extra),
                           honours_timeouts=os.environ.get("NURSERY_POLICY_TIMEOUTS") == "1",
                           name="Yours").TestCase
    _test.settings = default_settings(int(os.environ.get("NURSERY_POLICY_EXAMPLES", "200")))
    TestYourPolicyContract = _test
    del _test
