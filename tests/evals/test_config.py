from __future__ import annotations

from pathlib import Path

import pytest

from routeopt.evals.config import ConfigError, load_config


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "routeopt.yaml"
    p.write_text(text)
    return p


def test_paths_resolve_relative_to_config(tmp_path: Path) -> None:
    (tmp_path / "models" / "m").mkdir(parents=True)
    p = _write(
        tmp_path,
        """
candidates:
  - {name: a, provider: local, model: models/m, gpu_hour_usd: 1}
  - {name: b, provider: openai, model: gpt-x, input_price_per_mtok: 1, output_price_per_mtok: 2, api_key_env: KEY}
db_path: data/x.duckdb
""",
    )
    cfg = load_config(p)
    assert cfg.db_path == tmp_path / "data" / "x.duckdb"
    assert cfg.candidates[0].model == str(tmp_path / "models" / "m")
    assert cfg.candidates[0].variant == "fp32"
    assert cfg.candidates[1].model == "gpt-x"


@pytest.mark.parametrize(
    "body, field",
    [
        ("candidates: []", "candidates"),
        ("candidates:\n  - {name: a, provider: nope, model: m, gpu_hour_usd: 1}", "candidates.0.provider"),
        ("candidates:\n  - {name: a, provider: openai, model: m}", "needs a price"),
        (
            "candidates:\n  - {name: a, provider: openai, model: m, gpu_hour_usd: 1, bogus: 2}",
            "candidates.0.bogus",
        ),
        (
            "candidates:\n  - {name: a, provider: local, model: m, gpu_hour_usd: 1}\n"
            "  - {name: a, provider: local, model: m, gpu_hour_usd: 1}",
            "used twice",
        ),
        (
            "candidates:\n  - {name: a, provider: local, model: m, gpu_hour_usd: 1, max_concurrency: 0}",
            "candidates.0.max_concurrency",
        ),
        (
            "candidates:\n  - {name: a, provider: local, model: m, input_price_per_mtok: 1, gpu_tokens_per_s: 9}",
            "give gpu_hour_usd too",
        ),
    ],
)
def test_errors_name_the_field(tmp_path: Path, body: str, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(_write(tmp_path, body))
    assert field in str(exc.value)
    assert str(tmp_path / "routeopt.yaml") in str(exc.value)


def test_yaml_error_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"routeopt.yaml:3"):
        load_config(_write(tmp_path, "candidates:\n  - a\n b: [\n"))


def test_validation_errors_name_file_line_and_field(tmp_path: Path) -> None:
    """Each problem on its own `file:line: field: message` line, like `routeopt suites validate`."""
    path = _write(
        tmp_path,
        """candidates:
  - name: a
    provider: openai
    model: m
    max_concurrency: 0
    input_price_per_mtok: 1
router:
  quality_target: 3
""",
    )
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    lines = str(exc.value).splitlines()
    assert lines[0] == f"{path}: 2 problems in the config"
    assert lines[1].strip().startswith(f"{path}:5: candidates.0.max_concurrency: ")
    assert lines[2].strip().startswith(f"{path}:8: router.quality_target: ")


def test_a_misspelt_field_says_what_it_was_meant_to_be(tmp_path: Path) -> None:
    path = tmp_path / "routeopt.yaml"
    path.write_text(
        "candidates:\n  - {name: a, provider: openai, model: m, input_price_per_mtok: 1,\n"
        "     max_concurency: 3, prefix_cache: {blok_size: 8}}\nregistry: x\n"
        "preflight: {skip_brokn: true}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    lines = str(err.value).splitlines()[1:]
    assert sorted(line.strip() for line in lines) == [
        f"{path}:3: candidates.0.max_concurency: Extra inputs are not permitted; did you mean 'max_concurrency'?",
        f"{path}:3: candidates.0.prefix_cache.blok_size: Extra inputs are not permitted; did you mean 'block_size'?",
        f"{path}:4: registry: Extra inputs are not permitted; did you mean 'registry_dir'?",
        f"{path}:5: preflight.skip_brokn: Extra inputs are not permitted; did you mean 'skip_broken'?",
    ]


def test_one_error_is_one_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "candidates:\n  - {name: a, provider: openai, model: m, "
        "input_price_per_mtok: 1}\nrouter: {seed: x}\n",
    )
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value).startswith(f"{path}:3: router.seed: ") and "\n" not in str(exc.value)


def test_a_repeated_key_is_an_error_not_a_silent_override(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "candidates:\n  - {name: a, provider: openai, model: m, "
        "input_price_per_mtok: 1}\nrouter: {seed: 1}\nrouter: {seed: 2}\n",
    )
    with pytest.raises(ConfigError, match=r"routeopt.yaml:4: .*duplicate key 'router' \(first at line 3\)"):
        load_config(path)


def test_api_key_never_in_dump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-secret-123")
    cfg = load_config(
        _write(
            tmp_path,
            "candidates:\n  - {name: a, provider: openai, model: m, "
            "input_price_per_mtok: 1, api_key_env: MY_KEY}",
        )
    )
    assert cfg.candidates[0].api_key() == "sk-secret-123"
    assert "sk-secret-123" not in str(cfg.model_dump()) and "sk-secret-123" not in cfg.fingerprint()


def test_bundled_demo_config_is_valid(repo_root: Path) -> None:
    cfg = load_config(repo_root / "evals" / "demo" / "routeopt.yaml")
    assert len(cfg.candidates) >= 4
