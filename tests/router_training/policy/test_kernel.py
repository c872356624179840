"""The WebAssembly kernel (wasmtime) and the numpy steps it stands in for: the same bits on
every conformance vector, and the numpy path wherever the kernel cannot run."""

from __future__ import annotations

import dataclasses
import importlib.abc
import math
import struct
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routeopt.router_training.policy import kernel as kernel_module
from routeopt.router_training.policy.conformance import _serving_path, check_vectors, read_vectors
from routeopt.router_training.policy.numerics import sigmoid, sigmoid_list
from routeopt.router_training.policy.routing import RoutingPolicy

pytest.importorskip("wasmtime", reason="the kernel's tests need the 'fast' extra (wasmtime)")


@pytest.fixture(scope="module")
def saved(trained, tmp_path_factory):
    folder = tmp_path_factory.mktemp("policy")
    trained.policy.save(folder)
    return folder, (folder / "conformance.safetensors").read_bytes()


@pytest.fixture(scope="module")
def engines(saved) -> dict[str, RoutingPolicy]:
    policy = RoutingPolicy.load(saved[0], vectors=False)
    return {e: dataclasses.replace(policy, engine=e) for e in kernel_module.ENGINES}


def test_both_engines_decide_every_conformance_vector_as_it_says(saved, engines) -> None:
    inputs, meta, want = read_vectors(saved[1])
    targets = tuple(float(t) for t in meta["targets"])
    assert engines["webassembly"].engine_in_use == "webassembly"
    assert engines["numpy"].engine_in_use == "numpy"
    for engine, policy in engines.items():
        assert _serving_path(policy, inputs, want, targets) is None, engine


def test_both_engines_give_every_step_the_same_bits(saved, engines) -> None:
    inputs, _, _ = read_vectors(saved[1])
    wasm, numpy_path = engines["webassembly"], engines["numpy"]
    for inp in inputs:
        a, b = wasm.score_request(inp.text, inp.suite), numpy_path.score_request(inp.text, inp.suite)
        assert np.array_equal(a.ids, b.ids) and a.vals.tobytes() == b.vals.tobytes(), inp.text[:40]
        assert a.z.tobytes() == b.z.tobytes() and a.topic == b.topic
        assert a.p.tobytes() == b.p.tobytes() and a.c.tobytes() == b.c.tobytes()


def test_a_policy_loaded_with_the_kernel_passes_its_self_check(saved) -> None:
    policy = RoutingPolicy.load(saved[0])
    assert policy.engine_in_use == "webassembly"
    assert policy.self_check().ok


def test_without_wasmtime_the_numpy_steps_run(saved, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wasmtime", None)  # import wasmtime raises ImportError
    policy = RoutingPolicy.load(saved[0])
    assert policy.kernel is None and policy.engine_in_use == "numpy"
    assert policy.self_check().ok


def test_a_kernel_that_will_not_instantiate_falls_back_with_a_warning(saved, monkeypatch, caplog) -> None:
    monkeypatch.setattr(kernel_module, "_plan", lambda *a: 1 / 0)
    policy = RoutingPolicy.load(saved[0])
    assert policy.engine_in_use == "numpy" and policy.self_check().ok
    assert "the numpy steps run instead" in caplog.text


def test_a_broken_wasmtime_install_falls_back_with_a_warning(saved, monkeypatch, caplog) -> None:
    class Broken(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
            if name == "wasmtime":
                raise OSError("libwasmtime.so: cannot open shared object file")
            return None

    monkeypatch.delitem(sys.modules, "wasmtime", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    policy = RoutingPolicy.load(saved[0])
    assert policy.engine_in_use == "numpy" and policy.self_check().ok
    assert "libwasmtime.so" in caplog.text and "the numpy steps run instead" in caplog.text


def test_another_wasmtime_major_falls_back_with_a_warning(saved, monkeypatch, caplog) -> None:
    monkeypatch.setattr(kernel_module, "version", lambda name: "52.0.0")
    policy = RoutingPolicy.load(saved[0])
    assert policy.engine_in_use == "numpy" and policy.self_check().ok
    assert "wasmtime 52.0.0 is installed" in caplog.text


def test_a_failing_kernel_call_hands_the_policy_to_numpy_with_one_warning(saved, engines, caplog) -> None:
    policy = RoutingPolicy.load(saved[0], vectors=False)
    kernel = policy.kernel
    assert kernel is not None
    prompts = ["Sort these numbers: 3 1 2", "Add 2 and 2", "reverse: stone river"]
    want = [engines["numpy"].decide(x, "sort") for x in prompts]
    kernel._features._fn = lambda *args: 1  # wasmtime reports an error, as a trap does
    assert [policy.decide(x, "sort") for x in prompts] == want
    assert policy.kernel is None and policy.engine_in_use == "numpy"
    assert caplog.text.count("the WebAssembly kernel failed") == 1
    assert not kernel.lock.locked()


def test_the_engine_is_chosen_by_the_environment(saved, monkeypatch) -> None:
    monkeypatch.setenv("ROUTEOPT_ENGINE", "numpy")
    assert RoutingPolicy.load(saved[0], vectors=False).engine_in_use == "numpy"
    monkeypatch.setenv("ROUTEOPT_ENGINE", "fortran")
    with pytest.raises(ValueError, match="ROUTEOPT_ENGINE"):
        RoutingPolicy.load(saved[0], vectors=False).decide("hi")


def test_a_decision_finding_the_kernel_busy_takes_the_numpy_path(engines) -> None:
    policy = engines["webassembly"]
    prompt = "Sort these numbers: 3 1 2"
    want = policy.decide(prompt, "sort")
    kernel = policy.kernel
    assert kernel is not None
    with kernel.lock:  # another thread's decision
        assert policy.decide(prompt, "sort") == want


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")  # numpy's NaN
@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=40))
def test_the_kernels_sigmoid_is_the_specs_bit_for_bit(engines, values) -> None:
    kernel = engines["webassembly"].kernel
    assert kernel is not None
    values = values[: kernel.columns]
    with kernel.lock:
        got = kernel.sigmoids(values)
    want = sigmoid(np.array(values)).tolist()
    assert len(got) == len(values)
    for g, w, v in zip(got, want, values):
        assert (math.isnan(g) and math.isnan(w)) or struct.pack("<d", g) == struct.pack("<d", w), v


def test_the_kernels_sigmoid_holds_at_the_edges_of_the_exponential(engines) -> None:
    kernel = engines["webassembly"].kernel
    assert kernel is not None
    edges = [0.0, -0.0, 5e-324, -5e-324, 700.0, -700.0, 700.0000000000001, -699.9999999999999, 745.2, 1e308]
    edges += [k * math.log(2) + d for k in range(-1010, 1011, 97) for d in (-1e-9, 0.0, 1e-9)]
    for chunk in (edges[i : i + kernel.columns] for i in range(0, len(edges), kernel.columns)):
        with kernel.lock:
            got = kernel.sigmoids(chunk)
        assert got == sigmoid_list(chunk)


def test_the_kernels_scores_match_without_topic_costs_and_for_unknown_suites(engines) -> None:
    """The kernel's logits, probabilities, costs and topic against the numpy steps, where the cost
    model has no topic offsets (older policies) and where the suite is unknown or missing."""
    inputs = ["Sort these numbers: 3 1 2", "Reverse 'stone river'", "", "add 2 and 40, then explain?" * 9]
    for policy in (
        engines,
        {
            e: dataclasses.replace(p, cost_model=dataclasses.replace(p.cost_model, topic_coef=None))
            for e, p in engines.items()
        },
    ):
        assert policy["webassembly"].kernel is not None and policy["webassembly"].kernel.table is not None
        for text in inputs:
            for suite in ("sort", None, "no-such-suite"):
                a = policy["webassembly"].score_request(text, suite)
                b = policy["numpy"].score_request(text, suite)
                assert a.topic == b.topic and a.z.tobytes() == b.z.tobytes(), (text, suite)
                assert a.p.tobytes() == b.p.tobytes() and a.c.tobytes() == b.c.tobytes(), (text, suite)


def test_huge_and_empty_prompts_fit_the_kernel(engines) -> None:
    for prompt in ("", "a " * 5000, "x" * 20000, "\ud800" * 3000):
        a = engines["webassembly"].decide(prompt, None)
        assert a == engines["numpy"].decide(prompt, None)


@pytest.fixture(scope="module")
def timed_saved(tmp_path_factory):
    """A format 4 policy (latency models and budget tiers), saved with its vectors."""
    from routeopt.router_training.train import train_router
    from tests.router_training.conftest import timed_frame

    folder = tmp_path_factory.mktemp("timed")
    train_router(timed_frame(), quality_target=0.9, seed=0).policy.save(folder)
    return folder, (folder / "conformance.safetensors").read_bytes()


@pytest.fixture(scope="module")
def timed_engines(timed_saved) -> dict[str, RoutingPolicy]:
    policy = RoutingPolicy.load(timed_saved[0], vectors=False)
    assert policy.latency is not None
    return {e: dataclasses.replace(policy, engine=e) for e in kernel_module.ENGINES}


def test_both_engines_decide_under_every_budget_of_the_vectors_as_they_say(
    timed_saved, timed_engines
) -> None:
    inputs, meta, want = read_vectors(timed_saved[1])
    assert "budget" in meta["layers"] and "latency" in meta["layers"] and meta["budgets"]
    targets = tuple(float(t) for t in meta["targets"])
    for engine, policy in timed_engines.items():
        assert policy.engine_in_use == engine
        assert check_vectors(policy, timed_saved[1]).ok, engine  # every layer, budget included
        assert _serving_path(policy, inputs, want, targets, meta["budgets"]) is None, engine


def test_both_engines_give_the_same_decision_and_budget_outcome(timed_saved, timed_engines) -> None:
    inputs, meta, _ = read_vectors(timed_saved[1])
    wasm, numpy_path = timed_engines["webassembly"], timed_engines["numpy"]
    for i, inp in enumerate(inputs[:300]):
        kind, budget, target = meta["budgets"][i % len(meta["budgets"])]
        asked = {f"{kind}_budget_s": budget}
        a = wasm.decide(inp.text, inp.suite, target, **asked)
        assert a == numpy_path.decide(inp.text, inp.suite, target, **asked), (i, kind, budget)
        assert a.budget is not None and a.budget.kind == kind
