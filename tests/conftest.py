"""What every test gets."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["pytester"]   # tests/test_environment_as_found.py runs this file in a pytest of its own

PYTEST_OWN = "PYTEST_CURRENT_TEST"   # pytest renames the running test in it at every phase


@pytest.fixture(autouse=True)
def environment_as_found():
    """Each test leaves os.environ as it found it. Code under test may set a variable for the rest of its
    process (the vLLM backend sets HF_HUB_OFFLINE=1 before vLLM imports huggingface_hub); run in pytest's
    process, it would reach every later test, and the warm interpreter's tests compare environments."""
    found = {name: value for name, value in os.environ.items() if name != PYTEST_OWN}
    yield
    for name in set(os.environ) - set(found) - {PYTEST_OWN}:
        del os.environ[name]
    for name, value in found.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
