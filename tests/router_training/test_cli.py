import json

import pytest
from click.testing import CliRunner

from routeopt.flows.cli import cli
from tests.router_training.conftest import demo_frame


def test_import_train_route_end_to_end(tmp_path, monkeypatch):
    key = tmp_path / "keys" / "signing_key.pem"
    monkeypatch.setenv("ROUTEOPT_SIGNING_KEY", str(key))  # train creates it on first use
    monkeypatch.delenv("ROUTEOPT_PUBLIC_KEY", raising=False)
    runner = CliRunner()
    data = tmp_path / "outcomes.parquet"
    demo_frame(n_items=60).to_parquet(data)
    db, registry = tmp_path / "db.duckdb", tmp_path / "registry"
    r = runner.invoke(cli, ["import", "outcomes", str(data), "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert "720 outcomes" in r.output
    r = runner.invoke(cli, ["import", "outcomes", str(data), "--db", str(db)])
    assert "already imported" in r.output

    r = runner.invoke(cli, ["train", "--db", str(db), "--registry", str(registry), "--quality-target", "0.9"])
    assert r.exit_code == 0, r.output
    assert "held-out at target 0.9" in r.output and "(signed, key " in r.output
    assert "published policy: fitted on all 180 requests" in r.output  # refit after measuring
    assert f"created the signing key {key}" in r.output
    assert oct(key.stat().st_mode & 0o777) == "0o600" and (key.parent / "public_key.pem").exists()

    requests = tmp_path / "in.jsonl"
    requests.write_text(
        json.dumps({"id": "a", "prompt": "Task: add the input. difficulty: 1. Input: stone", "suite": "add"})
        + "\n"
        + json.dumps({"id": "b", "prompt": "Task: sort the input. difficulty: 5. Input: x y z"})
        + "\n"
    )
    out = tmp_path / "decisions.jsonl"
    r = runner.invoke(
        cli, ["route", "--policy", str(registry), "--input", str(requests), "--output", str(out)]
    )
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == ["a", "b"]
    assert {row["model"] for row in rows} <= {"tiny", "small", "medium", "large"}

    r = runner.invoke(
        cli, ["route", "--policy", str(registry), "Task: add. difficulty: 2.", "--suite", "add"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["model"] in {"tiny", "small", "medium", "large"}


def test_train_certifies_toward_a_traffic_sample_or_robustly_and_says_so(tmp_path, monkeypatch):
    """--traffic (a JSONL of prompts, or decision logs without text) and --robust: the manifest
    records what the certificate assumes, and `train` prints it."""
    from routeopt.artifacts.publish.registry import show

    monkeypatch.setenv("ROUTEOPT_SIGNING_KEY", str(tmp_path / "keys" / "signing_key.pem"))
    monkeypatch.delenv("ROUTEOPT_PUBLIC_KEY", raising=False)
    runner = CliRunner()
    data, db, registry = tmp_path / "outcomes.parquet", tmp_path / "db.duckdb", tmp_path / "registry"
    frame = demo_frame(n_items=60)
    frame.to_parquet(data)
    assert runner.invoke(cli, ["import", "outcomes", str(data), "--db", str(db)]).exit_code == 0
    hard = frame[frame["prompt"].str.contains("difficulty: [45]")].drop_duplicates("request_id")
    prompts = tmp_path / "traffic.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": p, "suite": s}) + "\n" for p, s in zip(hard.prompt, hard.suite))
    )
    r = runner.invoke(cli, ["train", "--db", str(db), "--registry", str(registry), "--traffic", str(prompts)])
    assert r.exit_code == 0, r.output
    assert f"requests like the traffic sample of {len(hard)} requests" in r.output
    cert = show(str(registry), 1)["metrics"]["knob"]["certificate"]
    assert cert["mode"] == "traffic" and cert["traffic"]["n_traffic"] == len(hard)
    assert 0 < cert["traffic"]["effective_sample_size"] < 180 and cert["traffic"]["separability_auc"] > 0.6
    log = tmp_path / "log.jsonl"
    log.write_text(
        "".join(
            json.dumps(
                {
                    "kind": "decision",
                    "time": "2025-03-01T10:00:00Z",
                    "request_id": f"r{i}",
                    "suite": s,
                    "prompt_chars": len(p),
                    "model": "tiny",
                    "propensity": 1.0,
                }
            )
            + "\n"
            for i, (p, s) in enumerate(zip(hard.prompt, hard.suite))
        )
    )
    r = runner.invoke(cli, ["train", "--db", str(db), "--registry", str(registry), "--traffic", str(log)])
    assert r.exit_code == 0, r.output
    assert (
        "without text (suites and lengths)"
        in show(str(registry), 2)["metrics"]["knob"]["certificate"]["traffic"]["source"]
    )
    r = runner.invoke(cli, ["train", "--db", str(db), "--registry", str(registry), "--robust", "2"])
    assert r.exit_code == 0, r.output
    assert "within a factor 2 of the calibration mix" in r.output
    assert show(str(registry), 3)["metrics"]["knob"]["certificate"]["gamma"] == 2.0
    r = runner.invoke(
        cli,
        ["train", "--db", str(db), "--registry", str(registry), "--robust", "2", "--traffic", str(prompts)],
    )
    assert r.exit_code != 0 and "not both" in r.output


def test_route_reports_bad_input_line(tmp_path, trained):
    trained.policy.save(tmp_path / "policy")
    bad = tmp_path / "in.jsonl"
    bad.write_text('{"id": 1, "prompt": "ok"}\n{"id": 2}\n')
    r = CliRunner().invoke(cli, ["route", "--policy", str(tmp_path / "policy"), "--input", str(bad)])
    assert r.exit_code != 0 and "bare policy folder has no manifest or signature" in r.output
    r = CliRunner().invoke(
        cli, ["route", "--policy", str(tmp_path / "policy"), "--input", str(bad), "--allow-unsigned"]
    )
    assert r.exit_code != 0 and "in.jsonl:2:" in r.output and "prompt" in r.output


def test_import_error_is_one_clear_line(tmp_path):
    bad = tmp_path / "o.csv"
    bad.write_text("request_id,prompt,model\nq1,hi,m\n")
    r = CliRunner().invoke(cli, ["import", "outcomes", str(bad), "--db", str(tmp_path / "db.duckdb")])
    assert r.exit_code != 0 and "missing required column(s): score (or passed)" in r.output


def _write_set(folder, seed):
    folder.mkdir(parents=True)
    demo_frame(n_items=60, seed=seed).to_parquet(folder / "train.parquet")
    demo_frame(n_items=30, seed=seed + 100).to_parquet(folder / "test.parquet")


def test_bench_router_measures_the_knob_on_every_set(tmp_path):
    """A folder of sets and extra --train/--test pairs in one command: per set the knob at every
    user target beside the reference, then a summary across sets, a plot and JSON."""
    _write_set(tmp_path / "sets" / "alpha", 1)
    _write_set(tmp_path / "sets" / "beta", 2)
    extra_train, extra_test = tmp_path / "gamma" / "train.parquet", tmp_path / "gamma" / "test.csv"
    extra_train.parent.mkdir()
    demo_frame(n_items=60, seed=3).to_parquet(extra_train)
    demo_frame(n_items=30, seed=4).to_csv(extra_test, index=False)
    png, out = tmp_path / "curves.png", tmp_path / "r.json"
    r = CliRunner().invoke(
        cli,
        [
            "bench",
            "router",
            "--sets",
            str(tmp_path / "sets"),
            "--train",
            str(extra_train),
            "--test",
            str(extra_test),
            "--plot",
            str(png),
            "--json",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    for name in (
        "== alpha",
        "== beta",
        "== gamma",
        "summary across sets",
        "knob",
        "reference",
        "zero_router",
        "oracle",
        "S100",
        "S95",
        "AIQ",
        "certified",
        "promise",
    ):
        assert name in r.output, name
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    reports = json.loads(out.read_text())
    assert [rep["name"] for rep in reports] == ["gamma", "alpha", "beta"]
    for rep in reports:
        targets = [row["target"] for row in rep["targets"]]
        assert targets == [0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 1.0, 1.05, 1.1]
        passes = [row["pass_rate"] for row in rep["targets"]]
        assert passes[0] == pytest.approx(rep["per_candidate"]["tiny"]["pass_rate"])  # target 0: cheapest
        assert rep["table"]["knob"]["aiq"] > 0 and "reference_pass_rate" in rep["targets"][0]


def test_bench_router_needs_pairs(tmp_path):
    r = CliRunner().invoke(cli, ["bench", "router"])
    assert r.exit_code != 0 and "--sets" in r.output
    train = tmp_path / "t.parquet"
    demo_frame(n_items=10).to_parquet(train)
    r = CliRunner().invoke(cli, ["bench", "router", "--train", str(train)])
    assert r.exit_code != 0 and "one --test per --train" in r.output


def test_bench_router_with_shifts_measures_every_certificate_on_every_shift(tmp_path):
    """`--shift all`: per shift the default knob, the knob certified toward the shifted prompts
    and the robust one, against the best single on the shifted requests; JSON keeps them."""
    folder = tmp_path / "sets" / "alpha"
    folder.mkdir(parents=True)
    demo_frame(n_items=90, seed=5).to_parquet(folder / "train.parquet")
    demo_frame(n_items=90, seed=6).to_parquet(folder / "test.parquet")
    out = tmp_path / "r.json"
    r = CliRunner().invoke(
        cli,
        [
            "bench",
            "router",
            "--sets",
            str(tmp_path / "sets"),
            "--shift",
            "all",
            "--robust",
            "1.5",
            "--json",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "== alpha: shifted test sets" in r.output and "== shifted sets: summary" in r.output
    shifts = json.loads(out.read_text())[0]["shifts"]
    assert shifts["robust_gamma"] == 1.5
    rows = {s["shift"]: s for s in shifts["shifts"]}
    assert set(rows) == {"none", "hard", "suites", "long"}
    assert set(rows["none"]["policies"]) == {"default", "robust"}
    for name in ("hard", "suites", "long"):
        row = rows[name]
        assert set(row["policies"]) == {"default", "traffic", "robust"} and 0 < row["n"] < shifts["n_test"]
        weighted = row["policies"]["traffic"]
        assert weighted["weights"]["n_traffic"] == row["n"] and weighted["knob"]["reference_model"]
        best = max(weighted["per_candidate"].values(), key=lambda v: v["pass_rate"])
        assert weighted["best_single"]["pass_rate"] == best["pass_rate"]  # floors: best on the shifted set
        assert set(weighted["checks"]) == {
            "pass@0.8 >= floor - 0.015",
            "pass@0.9 >= floor - 0.015",
            "pass@0.95 >= floor - 0.015",
            "pass@1 >= floor - 0.01",
        }
