"""Your own environment: by Python path, by entry point, with its own
validated `env_config`, and one-line errors for everything that can go wrong."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES

from skillstate.cli.main import cli
from skillstate.envs import SkillEnv
from skillstate.envs.registry import known_names, resolve_env

CUSTOM = EXAMPLES / "custom_env"
EXACT = "python:exact_env:ExactAnswerEnv"


class NotAnEnv:
    pass


class NeedsData(SkillEnv):
    def default_skill(self) -> str:
        return "# s\n"


@pytest.fixture
def example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(CUSTOM))
    yield
    sys.modules.pop("exact_env", None)


def _run(db: str, *args: str):
    return CliRunner().invoke(cli, ["run", "--data", str(EXAMPLES / "qa"), "--epochs", "1", "--batch-size", "12",
                                    "-q", "--db", db, *args])


def _one_line_error(res, words: str) -> None:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in res.output, res.output


def test_the_worked_example_trains_audits_verifies_and_resumes_with_its_stored_settings(example_on_path, tmp_path):
    db = f"sqlite:///{tmp_path / 'c.db'}"
    res = CliRunner().invoke(cli, ["run", "--config", str(CUSTOM / "config.yaml"), "--epochs", "1", "-q",
                                   "--run-id", "c", "--db", db])
    assert res.exit_code == 0, res.output
    started = json.loads(CliRunner().invoke(cli, ["log", "c", "--json", "--db", db]).output)[0]["payload"]
    assert started["config"]["env"] == EXACT and started["config"]["env_config"] == {"case_sensitive": False}
    assert CliRunner().invoke(cli, ["audit", "c", "--db", db]).exit_code == 0
    assert "reproduces all" in CliRunner().invoke(cli, ["replay", "c", "--verify", "--db", db]).output
    again = CliRunner().invoke(cli, ["run", "--config", str(CUSTOM / "config.yaml"), "--epochs", "1", "-q",
                                     "--run-id", "c", "--db", db])
    assert again.exit_code == 0, again.output  # the same config resumes: its settings' defaults are no change
    rollout = next(e for e in json.loads(CliRunner().invoke(cli, ["log", "c", "--json", "--db", db]).output)
                   if e["type"] == "RolloutCompleted")
    assert any(r["fail_reason"].startswith("not exactly an answer") for r in rollout["payload"]["results"])


def test_env_config_is_validated_by_the_environments_model(example_on_path, tmp_path):
    db = f"sqlite:///{tmp_path / 'v.db'}"
    _one_line_error(_run(db, "--set", f"env={EXACT}", "--set", "env_config.case_sensitive=maybe"),
                    "invalid env_config.case_sensitive: Input should be a valid boolean")
    _one_line_error(_run(db, "--set", f"env={EXACT}", "--set", "env_config.typo=1"),
                    f"invalid env_config.typo: env {EXACT!r} has no such setting")
    _one_line_error(_run(db, "--set", "env_config.anything=1"), "invalid env_config.anything: env 'qa' has no such")
    res = _run(db, "--set", f"env={EXACT}", "--set", "env_config.case_sensitive=true", "--run-id", "t")
    assert res.exit_code == 0, res.output
    fork = CliRunner().invoke(cli, ["fork", "t", "1", "--set", "env_config.case_sensitive=false", "--db", db])
    _one_line_error(fork, "a fork cannot change env_config.case_sensitive")


@pytest.mark.parametrize("name,words", [
    ("nope", "unknown env 'nope' (known: evals, qa"),
    ("python:no_such_module_xyz:Env", "cannot import no_such_module_xyz: ModuleNotFoundError"),
    ("python:test_custom_env:Missing", "module test_custom_env has no Missing"),
    ("python:test_custom_env:NotAnEnv", "is not a skillstate environment"),
    ("python:just_a_module", "write python:MODULE:CLASS"),
])
def test_unknown_or_broken_environments_are_one_line(tmp_path, name, words):
    db = tmp_path / "e.db"
    _one_line_error(_run(f"sqlite:///{db}", "--set", f"env={name}"), words)
    if db.exists():
        assert json.loads(CliRunner().invoke(cli, ["runs", "--json", "--db", f"sqlite:///{db}"]).output) == []


def test_the_sim_backend_refuses_an_environment_it_cannot_play(tmp_path):
    for data in ([], ["--data", str(EXAMPLES / "qa")]):
        res = CliRunner().invoke(cli, ["run", "--set", "env=python:test_custom_env:NeedsData", "-q", *data,
                                       "--db", f"sqlite:///{tmp_path / 'n.db'}"])
        _one_line_error(res, "is none of the kinds the sim backend plays")


def test_an_installed_package_registers_an_environment_by_entry_point(tmp_path, monkeypatch):
    """A real distribution on sys.path (its .dist-info with entry_points.txt), as pip installs one."""
    site = tmp_path / "site"
    (site / "my_envs").mkdir(parents=True)
    (site / "my_envs" / "__init__.py").write_text(
        "from skillstate.envs import QAEnv\n\nclass Strict(QAEnv):\n    kind = 'strict'\n")
    info = site / "my_envs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-envs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[skillstate.envs]\nstrict = my_envs:Strict\nbroken = my_envs:Gone\n")
    monkeypatch.syspath_prepend(str(site))
    assert {"qa", "strict", "broken"} <= set(known_names())
    assert resolve_env("strict").kind == "strict"
    db = f"sqlite:///{tmp_path / 'p.db'}"
    assert _run(db, "--set", "env=strict").exit_code == 0
    _one_line_error(_run(db, "--set", "env=broken"), "env 'broken': its entry point my_envs:Gone fails to load")
    sys.modules.pop("my_envs", None)


def test_the_example_config_is_relative_to_its_folder():
    from skillstate.config_sources import build_config

    config = build_config(CUSTOM / "config.yaml")
    assert config.env == EXACT and Path(config.data or "") == (EXAMPLES / "qa").resolve()
