"""The gateway tests use the publishing side's fixtures (real signed policies in a registry) and
one clean gateway-only virtualenv per session."""

from pathlib import Path

import pytest

from tests.artifacts.conftest import keypair, other_keypair, policies, publish_to, registry  # noqa: F401
from tests.gateway_venv import build_gateway_venv


@pytest.fixture(scope="session")
def gateway_venv(tmp_path_factory) -> Path:
    """`pip install ./gateways/python` in a fresh virtualenv (built once per session, ~15 s)."""
    return build_gateway_venv(tmp_path_factory.mktemp("gateway-venv") / "venv")
