"""Writing a version's manifest: what publishing signs. Gateways read it with
routeopt.artifacts.serving.manifest, which defines the format."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Mapping

from routeopt.artifacts.serving.manifest import (
    FORMAT,
    RESERVED_NAMES,
    ManifestError,
    check_file_name,
    format_time,
    pretty_json,
    sha256_hex,
)
from routeopt.common.io import jsonable


def build_manifest(
    *,
    version: int,
    files: Mapping[str, bytes],
    lineage: dict,
    metrics: dict,
    policy: dict,
    created_at: datetime,
    expires_in: timedelta | None,
    publish_id: str | None = None,
    policy_format: dict | None = None,
) -> bytes:
    """The manifest bytes for a new version; file names are checked before anything is written.

    `publish_id` (random per publish) makes two publishers' manifests, hence their
    content-addressed folders, differ even for the same policy at the same second.
    `policy_format` names the policy's format version, whether other runtimes can serve it (and
    why not), and its conformance vectors' file (docs/policy-format.md, "Manifest")."""
    entries = []
    for name in sorted(files):
        check_file_name(name, f"policy file {name!r}")
        if name in RESERVED_NAMES:
            raise ManifestError(f"policy file {name!r}: the name is reserved for the registry")
        entries.append({"path": name, "sha256": sha256_hex(files[name]), "size": len(files[name])})
    doc = {
        "format": FORMAT,
        "version": version,
        "created_at": format_time(created_at),
        "expires_at": format_time(created_at + expires_in) if expires_in else None,
        "files": entries,
        "lineage": jsonable(lineage),
        "metrics": jsonable(metrics),
        "policy": jsonable(policy),
    }
    if publish_id is not None:
        doc["publish_id"] = publish_id
    if policy_format is not None:
        vectors = policy_format.get("conformance")
        if vectors is not None and vectors not in files:
            raise ManifestError(f"policy_format.conformance: {vectors!r} is not one of the policy's files")
        doc["policy_format"] = jsonable(policy_format)
    return pretty_json(doc)
