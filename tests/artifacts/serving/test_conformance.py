"""A gateway refuses a policy it disagrees with: attacks that a signature does not stop.

Each attack here is signed by the trusted key (a publisher bug, a stolen pipeline, a file mixed
up on the way): only the conformance vectors, the format rules and the loader stand between it
and traffic. The gateway must keep routing with the last good policy and say why.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from routeopt.artifacts.serving.loader import PolicyLoadError, load
from routeopt.router_training.policy.tensors import dumps, loads
from tests.artifacts.policies import PROMPTS


@pytest.fixture()
def served(policies, publish_to, registry, keypair):
    publish_to(policies[0])
    events: list[tuple[str, str]] = []
    router = load(registry, keypair[1], on_event=lambda k, m: events.append((k, m)))
    router.events = events
    assert "conformance requests agree at every layer" in router.status().conformance
    return router


class Altered:
    """A real policy whose saved files are changed by `edit(folder)` before they are signed."""

    def __init__(self, policy, edit, format_info=None) -> None:
        self.policy, self.edit, self.candidates = policy, edit, policy.candidates
        self.format_info = format_info or policy.format_info

    def save(self, folder: Path) -> list[str]:
        names = self.policy.save(folder)
        return self.edit(folder, names) or names

    def describe(self) -> dict:
        return self.policy.describe()


def _refused(router, pattern: str) -> str:
    assert router.refresh() is False
    status = router.status()
    assert status.version == 1 and status.last_error and pattern in status.last_error, status.last_error
    assert router.events[-1][0] == "rejected" and pattern in router.events[-1][1]
    assert router.route(*PROMPTS[0]).policy_version == 1
    return status.last_error


def _rewrite_arrays(folder: Path, change) -> None:
    tensors, meta = loads((folder / "arrays.safetensors").read_bytes(), "arrays")
    tensors = {k: np.array(v) for k, v in tensors.items()}
    change(tensors)
    (folder / "arrays.safetensors").write_bytes(dumps(tensors, meta))


def test_tampered_weights_under_a_valid_signature_fail_the_vectors(served, policies, publish_to) -> None:
    def edit(folder, names):
        _rewrite_arrays(
            folder,
            lambda t: t["scorer.weights"].__setitem__((slice(None), 0), t["scorer.weights"][:, 0] + 0.25),
        )

    publish_to(Altered(policies[1], edit))
    error = _refused(served, "conformance vectors disagree")
    assert "step scores" in error


def test_tampered_idf_names_the_features_step(served, policies, publish_to) -> None:
    def edit(folder, names):
        _rewrite_arrays(folder, lambda t: t["features.idf"].__setitem__(slice(0, None, 2), 7.0))

    publish_to(Altered(policies[1], edit))
    assert "step features" in _refused(served, "conformance vectors disagree")


def test_swapped_vectors_are_refused(served, policies, publish_to, tmp_path) -> None:
    other = tmp_path / "other"
    policies[0].save(other)

    def edit(folder, names):
        (folder / "conformance.safetensors").write_bytes((other / "conformance.safetensors").read_bytes())

    publish_to(Altered(policies[1], edit))
    _refused(served, "conformance vectors disagree")


def test_missing_vectors_are_refused(served, policies, publish_to) -> None:
    def edit(folder, names):
        (folder / "conformance.safetensors").unlink()
        return [n for n in names if n != "conformance.safetensors"]

    publish_to(Altered(policies[1], edit, {**policies[1].format_info, "conformance": None}))
    _refused(served, "conformance.safetensors is missing")


def test_truncated_arrays_are_refused(served, policies, publish_to) -> None:
    def edit(folder, names):
        data = (folder / "arrays.safetensors").read_bytes()
        (folder / "arrays.safetensors").write_bytes(data[: len(data) * 2 // 3])

    publish_to(Altered(policies[1], edit))
    _refused(served, "truncated")


@pytest.mark.parametrize("version", [99, 2, None])
def test_a_wrong_format_version_is_refused(served, policies, publish_to, version) -> None:
    def edit(folder, names):
        head = json.loads((folder / "policy.json").read_text())
        head["format_version"] = version
        (folder / "policy.json").write_text(json.dumps(head))

    publish_to(Altered(policies[1], edit))
    _refused(served, "policy does not load or decide")


def test_a_manifest_naming_another_format_is_refused(served, policies, publish_to) -> None:
    publish_to(Altered(policies[1], lambda f, n: None, {**policies[1].format_info, "version": 99}))
    _refused(served, "manifest.json says policy format 99")


def test_with_no_last_good_policy_the_reason_reaches_the_caller(
    policies, publish_to, registry, keypair
) -> None:
    def edit(folder, names):
        _rewrite_arrays(folder, lambda t: t["calibration.platt"].__setitem__((1, 0), 3.0))

    publish_to(Altered(policies[0], edit))
    with pytest.raises(PolicyLoadError, match="step calibration") as info:
        load(registry, keypair[1])
    assert info.value.kind == "conformance"
    router = load(registry, keypair[1], default_model="fallback-model")
    d = router.route(*PROMPTS[0])
    assert d.model == "fallback-model" and d.policy_version == 0 and "step calibration" in d.default_reason
