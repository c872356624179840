"""The gateway tests use the publishing side's fixtures (real signed policies in a registry) and
one clean gateway-only virtualenv per test run."""

from pathlib import Path

import pytest

from tests.artifacts.conftest import keypair, other_keypair, policies, publish_to, registry  # noqa: F401
from tests.gateway_venv import run_gateway_venv


@pytest.fixture(scope="session")
def gateway_venv(tmp_path_factory) -> Path:
    """`pip install ./gateways/python` in a fresh virtualenv (built once per test run, ~15 s)."""
    return run_gateway_venv(tmp_path_factory, "gateway")
