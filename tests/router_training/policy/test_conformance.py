"""Conformance vectors: what they hold, that the batch path is the one-request path, and that a
runtime which differs at any step is refused with that step named."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routeopt.router_training.policy import features
from routeopt.router_training.policy.batch_features import batch_predict
from routeopt.router_training.policy.conformance import check_vectors, read_vectors
from routeopt.router_training.policy.conformance_inputs import vector_inputs
from routeopt.router_training.policy.routing import CostModel, Knob, Member, RoutingPolicy


@pytest.fixture(scope="module")
def saved(trained, tmp_path_factory):
    folder = tmp_path_factory.mktemp("policy")
    trained.policy.save(folder)
    return folder, (folder / "conformance.safetensors").read_bytes()


def test_vectors_cover_hostile_text_the_cut_and_every_suite_kind(saved) -> None:
    folder, blob = saved
    inputs, meta, want = read_vectors(blob)
    texts = [i.text for i in inputs]
    assert len(inputs) >= 2000 and meta["layers"][0] == "bytes" and meta["layers"][-1] == "gateway"
    lengths = set(want["bytes.utf8_len"].tolist())
    assert {0, 8191, 8192, 8193} <= lengths and max(lengths) >= 1 << 20
    assert {"", "\x00", "\ud800", "İstanbul ıi İI", "😀"} <= set(texts)
    assert any("\u0301" in t for t in texts) and any("\u202e" in t for t in texts)
    suites = {i.suite for i in inputs}
    assert {None, "", "no-such-suite"} <= suites and set(RoutingPolicy.load(folder).spec.suites) <= suites
    chosen = np.unique(want["decision.model"])
    assert len(chosen) >= 2  # the decisions are not all the same candidate
    assert want["gateway.explored"].any() and want["gateway.arm"].any() and not want["gateway.arm"].all()
    assert len(blob) < 1_500_000


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


def _same_as_one_by_one(policy: RoutingPolicy, texts: list[str], suites: list) -> None:
    feats, z, topic, p, c = batch_predict(policy, texts, suites)
    for i, (text, suite) in enumerate(zip(texts, suites)):
        s = policy.score_request(text, suite)
        a, b = feats.row_offsets[i], feats.row_offsets[i + 1]
        assert np.array_equal(s.ids, feats.ids[a:b]), (i, text[:40])
        assert np.array_equal(_bits(s.vals), _bits(feats.vals[a:b])), (i, text[:40])
        assert np.array_equal(_bits(s.z), _bits(z[i])) and s.topic == topic[i]
        assert np.array_equal(_bits(s.p), _bits(p[i])) and np.array_equal(_bits(s.c), _bits(c[i]))


def test_the_batch_path_is_the_one_request_path_to_the_bit(trained) -> None:
    inputs = vector_inputs(tuple(trained.policy.spec.suites))[::3]
    _same_as_one_by_one(trained.policy, [i.text for i in inputs], [i.suite for i in inputs])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=300),
            st.sampled_from([None, "", "add", "sort", "nope"]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_any_text_gives_the_same_bits_both_ways(trained, batch) -> None:
    _same_as_one_by_one(trained.policy, [t for t, _ in batch], [s for _, s in batch])


def _changed(policy: RoutingPolicy, **kw) -> RoutingPolicy:
    out = dataclasses.replace(policy, **kw)
    return out


def test_a_runtime_that_differs_is_told_the_first_step_that_differs(saved, monkeypatch) -> None:
    folder, blob = saved
    policy = RoutingPolicy.load(folder)
    assert check_vectors(policy, blob).ok
    spec = policy.spec
    idf = tuple(v * (1.01 if i % 2 else 1.0) for i, v in enumerate(spec.idf))
    cases = {
        "buckets": _changed(
            policy,
            spec=dataclasses.replace(
                spec, n_buckets=spec.n_buckets // 2, idf=spec.idf[: spec.n_buckets // 2]
            ),
        ),
        "features": _changed(policy, spec=dataclasses.replace(spec, idf=idf)),
        "calibration": _changed(
            policy, platt=policy.platt * np.array([[1.0], [1.0 + 1e-6]]) + np.array([[0], [1e-6]])
        ),
        "cost": _changed(
            policy,
            cost_model=CostModel(
                policy.cost_model.coef, policy.cost_model.floor * 2 + 1e-9, policy.cost_model.topic_coef
            ),
        ),
        "decision": _changed(
            policy,
            knob=Knob(
                [Member("single", 0.0)] * len(policy.knob.members),
                policy.knob.points,
                policy.knob.top,
                policy.knob.confidence,
            ),
        ),
    }
    for step, changed in cases.items():
        report = check_vectors(changed, blob)
        assert not report.ok and report.first.startswith(f"step {step}"), (step, report.first)
        assert step in report.summary()
    monkeypatch.setattr(features, "_MAX_BYTES", 4096)
    report = check_vectors(policy, blob)
    assert not report.ok and report.first.startswith("step bytes"), report.first


def test_vectors_of_other_candidates_are_refused(saved) -> None:
    folder, blob = saved
    policy = RoutingPolicy.load(folder)
    policy = dataclasses.replace(policy, candidates=list(reversed(policy.candidates)))
    report = check_vectors(policy, blob)
    assert not report.ok and "swapped" in report.first


def test_garbage_vectors_are_a_clear_refusal(saved) -> None:
    folder, blob = saved
    policy = RoutingPolicy.load(folder)
    for bad in (b"", blob[:1000], blob[:-7], b"\x00" * 64):
        report = check_vectors(policy, bad)
        assert not report.ok and "conformance.safetensors" in report.first


_WORD_LAYERS = frozenset({"raw", "cut", "offsets", "word_offsets", "words", "lengths"})


def _assert_same_features(got, want, skip: frozenset[str] = frozenset()) -> None:
    """Every field of two batches of features but `skip`, the text's parts included, the same bits."""
    for name, w in want._asdict().items():
        g = getattr(got, name)
        if name == "text":
            for part, wp in w._asdict().items():
                if part not in skip:
                    assert np.array_equal(
                        np.asarray(getattr(g, part), dtype=object), np.asarray(wp, dtype=object)
                    ), part
        elif name not in skip:
            assert g.dtype == w.dtype and np.array_equal(g, w), name


def test_features_taken_from_reused_text_layers_are_those_computed_alone() -> None:
    """Training computes the text steps of all its prompts once and takes batches from them:
    every field of those batches must be what computing the batch alone gives, but the bytes
    and words, which the memo does not keep."""
    from dataclasses import replace

    from routeopt.router_training.policy import conformance
    from routeopt.router_training.policy.batch_features import batch_features, reuse_text_layers

    inputs = vector_inputs(("math", "code"), n_synthetic=300)
    texts, suites = [i.text for i in inputs], [i.suite for i in inputs]
    spec = replace(features.FeatureSpec(suites=("code", "math")), stat_mean=(0.5,) * 9, stat_std=(2.0,) * 9)
    rng = np.random.default_rng(0)
    pick = rng.permutation(len(texts))[: len(texts) // 3]
    some, their = [texts[i] for i in pick], [suites[i] for i in pick]
    alone = batch_features(some, their, spec)
    with reuse_text_layers(texts + ["only in the memo"]):
        reused = batch_features(some, their, spec)
        first = batch_features(texts[:5], suites[:5], spec)  # a second take from the same layers
        missing = batch_features(["not among them"], [None], spec)  # computed, not taken
    with reuse_text_layers(texts):
        whole = batch_features(texts, suites, spec)  # the layers themselves
    assert np.array_equal(whole.vals, batch_features(texts, suites, spec).vals)
    assert first.ids.tolist() == batch_features(texts[:5], suites[:5], spec).ids.tolist()
    _assert_same_features(missing, batch_features(["not among them"], [None], spec))
    _assert_same_features(reused, alone, skip=_WORD_LAYERS)
    assert reused.text.raw == [] and not len(reused.words) and not len(reused.lengths)
    assert not reused.word_offsets.any() and not reused.text.offsets.any()
    with pytest.raises(RuntimeError, match="reuse_text_layers"):
        conformance._text_layers(reused, 5)


def test_text_steps_computed_a_block_at_a_time_are_the_same_bits(monkeypatch) -> None:
    from routeopt.router_training.policy import batch_features as B

    inputs = vector_inputs(("math",), n_synthetic=200)
    texts, suites = [i.text for i in inputs], [i.suite for i in inputs]
    spec = features.FeatureSpec(suites=("math",))
    monkeypatch.setattr(B, "_BLOCK_BYTES", 1 << 40)
    whole = B.batch_features(texts, suites, spec)
    monkeypatch.setattr(B, "_BLOCK_BYTES", 3000)  # many blocks, and the 1 MB text alone in one
    monkeypatch.setattr(B, "available_cores", lambda: 1)
    blocks = B.batch_features(texts, suites, spec)
    _assert_same_features(blocks, whole)
    monkeypatch.setattr(B, "available_cores", lambda: 2)  # the blocks on a pool of threads
    _assert_same_features(B.batch_features(texts, suites, spec), whole)


def test_the_specs_counts_read_off_reused_layers_are_those_counted_a_block_at_a_time() -> None:
    """Training fits idf and the statistics' scaling from the memo's layers; a spec fitted
    outside the memo counts the same texts a block at a time: the same numbers."""
    from routeopt.router_training.policy.batch_features import reuse_text_layers, text_counts

    inputs = vector_inputs(("math", "code"), n_synthetic=300)
    texts = [i.text for i in inputs]
    some = texts[::3] + texts[:7]  # repeats counted as requests
    spec = features.FeatureSpec(suites=("code", "math"))
    stats, df = text_counts(some, spec, block=17)
    with reuse_text_layers(texts):
        memo_stats, memo_df = text_counts(some, spec)
    assert np.array_equal(stats, memo_stats) and np.array_equal(df, memo_df)
    text_entries = [len(features.request_features(t, None, spec)[0]) - 9 for t in some]  # one path
    assert df.sum() == sum(text_entries)


def test_a_forked_worker_gets_a_pool_of_its_own(monkeypatch) -> None:
    """A server that forks its workers after the parent used the batch path's threads: the
    child has none of them, and a batch there must still finish."""
    import os
    import time

    from routeopt.router_training.policy import batch_features as B

    monkeypatch.setattr(B, "available_cores", lambda: 2)
    assert B.parallel_map(abs, [-1, -2, 3]) == [1, 2, 3]  # the parent's pool, started
    pid = os.fork()
    if pid == 0:  # the child: exits 0 only once its batch is done
        os._exit(0 if B.parallel_map(abs, [-4, 5]) == [4, 5] else 1)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.1)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's batch never finished: it waited on the parent's threads")
