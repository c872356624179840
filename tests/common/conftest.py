"""Fixtures shared by common's tracing tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def memory():
    """Tracing on in this process, every span built and kept in memory as it ends."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from common import tracing

    exporter = InMemorySpanExporter()
    tracing.configure(exporter, batch=False)
    yield exporter
    tracing.disable()
