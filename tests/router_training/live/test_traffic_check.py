"""The serving policy's traffic check, through the real path: a gateway logs, the logs and the
feedback are imported, the monitor and the live promise read the stored frame."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from routeopt.artifacts.publish.promotion import decide_promotion, promise_broken
from routeopt.evals.storage.store import Store
from routeopt.evals.storage.traffic import load_traffic
from routeopt.router_training.live.promise import live_promise
from routeopt.router_training.live.shift_monitor import check_traffic
from routeopt.router_training.policy.routing import Knob
from tests.benchmarks import load
from tests.ops_receiver import receiver  # noqa: F401 (a fixture)

tr = load("traffic_replay")


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    """A champion trained on a synthetic fleet; its traffic replayed as it is and harder."""
    folder = tmp_path_factory.mktemp("check")
    champion, second = tr.train_pair(tr.synthetic_frame(0, 900))
    registry = tr.publish_pair(folder, champion, second)
    fleet = tr.fleet_from_frame(tr.synthetic_frame(1, 900))
    level = np.array([int(p.split("level ")[1].split(":")[0]) for p in fleet.prompts])
    harder = fleet.subset(np.flatnonzero(level >= 4))
    stores = {
        "same": tr.replay(registry, fleet, folder / "same", mode="text", seed=3, rate=0.2),
        "harder": tr.replay(registry, harder, folder / "harder", mode="text", seed=4, rate=0.2, reps=2),
    }
    frames = {}
    for name, path in stores.items():
        with Store(path, read_only=True) as store:
            frames[name] = load_traffic(store)
    return champion, fleet, harder, frames


def test_the_monitor_flags_harder_traffic_and_names_what_moved(replays) -> None:
    champion, _, _, frames = replays
    same = check_traffic(frames["same"], champion, 1)
    assert same.shift is not None and not same.shift.shifted, same.summary_line()
    harder = check_traffic(frames["harder"], champion, 1)
    assert harder.shift.shifted and harder.shift.p_value < 0.01 and harder.alert
    moved = {f.feature for f in harder.shift.moved()}
    assert moved == {"log_chars", "route@0.95"}  # longer prompts, routed to stronger models
    assert "traffic shift on 924 logged requests" in harder.summary_line()
    few = check_traffic(frames["same"].iloc[:50], champion, 1)
    assert few.shift is None and "50 logged requests, 200 needed" in few.summary_line()
    untrained = replace(champion, metrics={})
    assert "no reference sketch" in check_traffic(frames["same"], untrained, 1).note


def _truth_margin(policy, fleet) -> float:
    """The promise's true margin on the replayed requests: pass rate - x * the reference's."""
    passed, _ = tr.truth(policy, fleet)
    ref = fleet.Y[:, fleet.candidates.index(policy.reference_model)].mean()
    return passed - policy.quality_target * ref


def test_the_live_promise_covers_the_truth_and_catches_a_knob_that_lies(replays) -> None:
    champion, fleet, harder, frames = replays
    for name, requests in (("same", fleet), ("harder", harder)):
        p = live_promise(frames[name], 1, champion)
        m = p["margin"]
        assert p["n"] == len(frames[name]) and p["reference_model"] == champion.reference_model
        truth = _truth_margin(champion, requests)
        assert m["low"] - 2 * m["se"] <= truth <= m["high"] + 2 * m["se"], (name, m, truth)
    cheapest = champion.knob.points[0]
    lying = replace(
        champion,
        knob=Knob(
            champion.knob.members,
            [replace(cheapest, certified=2.0)],
            champion.knob.top,
            champion.knob.confidence,
        ),
    )
    assert _truth_margin(lying, fleet) < -0.1
    p = live_promise(frames["same"], None, lying)  # decided again on the kept text
    assert p["broken"] and p["margin"]["high"] < 0
    why = promise_broken(p, min_feedback=200)
    assert "the promise does not hold on this traffic" in why
    assert promise_broken(p, min_feedback=10**6) == ""
    gate = decide_promotion(lying, None, fleet.subset(np.arange(50)), tolerance=0.01, live_promise=p)
    assert not gate.promoted and gate.decided_by == "live traffic" and gate.reason == why
    check = check_traffic(frames["same"], lying, None, min_feedback=200)
    assert check.alert and "BROKEN" in check.summary_line()


def test_a_shift_goes_out_to_the_webhook_and_the_dashboard(replays, receiver, monkeypatch, tmp_path) -> None:  # noqa: F811
    from routeopt.evals.config import AlertSettings
    from routeopt.reports.alerts import send_traffic_alerts
    from routeopt.reports.dashboard import gather, render_html

    champion, _, _, frames = replays
    url, handler = receiver
    monkeypatch.setenv("ROUTEOPT_TEST_HOOK", url)
    settings = AlertSettings(webhook_url_env="ROUTEOPT_TEST_HOOK")
    quiet = check_traffic(frames["same"], champion, 1)
    assert send_traffic_alerts(quiet, settings, events=False) == {"events": 0, "webhook": None}
    harder = check_traffic(frames["harder"], champion, 1)
    assert send_traffic_alerts(harder, settings, events=False) == {"events": 0, "webhook": True}
    body = handler.received[-1]["body"]
    assert body["kind"] == "traffic" and body["alert"] and "traffic shift on 924" in body["text"]
    assert {f["feature"] for f in body["shift"]["features"] if f["moved"]} == {"log_chars", "route@0.95"}
    with Store(tmp_path / "db.duckdb") as store:
        store.begin_run("run-1")
        store.finish_run("run-1")
        html = render_html(gather(store, "run-1", traffic=harder.to_dict()))
    assert "does it still look like the requests the policy was certified on" in html
    assert "route@0.95" in html and harder.summary_line().split(":")[0] in html


@pytest.mark.slow
def test_a_traffic_check_goes_out_as_prefect_events(replays, prefect_harness) -> None:
    """Emitted to a real (temporary) Prefect server and read back through its events API."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventIDFilter, EventNameFilter
    from prefect.events.worker import EventsWorker

    from routeopt.reports.alerts import emit_traffic_events

    champion, _, _, frames = replays
    check = check_traffic(frames["harder"], champion, 1)
    emitted = emit_traffic_events(check)
    assert all(e is not None for e in emitted)
    EventsWorker.drain_all()
    wanted = EventFilter(  # these events (other tests on the server check traffic too)
        event=EventNameFilter(prefix=["routeopt.traffic."]), id=EventIDFilter(id=[e.id for e in emitted])
    )
    deadline, got = time.monotonic() + 30, []
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline and len(got) < 3:
            time.sleep(0.5)
            got = client.read_events(filter=wanted, limit=50).events
    names = sorted(e.event for e in got)
    assert names == ["routeopt.traffic.checked", "routeopt.traffic.shift", "routeopt.traffic.shift"]
    assert {e.resource.get("routeopt.feature") for e in got if e.event == "routeopt.traffic.shift"} == {
        "log_chars",
        "route@0.95",
    }
