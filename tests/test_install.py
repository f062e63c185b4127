"""A plain (non-editable) `pip install .` works: console script, prompts and
migrations ship in the package, and no bare `cli`/`migrations` is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    target = base / "site"
    # a plain (non-editable) install into its own directory; its dependencies come from this environment
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--target", str(target), str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    env = {**os.environ, "PYTHONPATH": str(target)}
    return target, base, env


def test_installed_package_creates_its_database_and_runs(installed):
    target, base, env = installed
    work = base / "elsewhere"
    work.mkdir()
    exe = target / "bin" / "skillstate"
    up = subprocess.run([str(exe), "db", "upgrade", "--db", "sqlite:///fresh.db"], cwd=work, env=env,
                        capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    assert "upgraded from empty" in up.stdout
    run = subprocess.run([str(exe), "run", "--epochs", "1", "-q"], cwd=work, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "completed" in run.stdout and (work / "skillstate.db").exists()


def test_installed_layout(installed):
    target, base, env = installed
    code = ("import skillstate, skillstate.cli, skillstate.migrations, importlib.util as u, json;"
            "print(json.dumps([skillstate.__file__, skillstate.migrations.__file__,"
            " u.find_spec('cli') is None, u.find_spec('migrations') is None]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=base, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    import json

    pkg, migrations, no_cli, no_migrations = json.loads(out.stdout)
    assert str(target) in pkg and str(target) in migrations
    assert (Path(migrations).parent / "versions" / "0001_initial.py").exists()
    assert (Path(pkg).parent / "prompts" / "failure_analyst.md").exists()
    assert no_cli and no_migrations


def test_installed_dashboard_ships_its_templates_and_charts(installed):
    target, _base, _env = installed
    package = target / "skillstate" / "dashboard"
    for name in ("templates/base.html", "templates/run.html", "templates/step.html", "static/chart.umd.min.js",
                 "static/chart.js-LICENSE.md", "static/dashboard.js", "static/dashboard.css"):
        assert (package / name).is_file(), name


def test_every_package_of_the_tree_is_installed(installed):
    """pyproject.toml lists the packages one by one: a package left out of the list is missing from a plain
    install (the workspace environment once was)."""
    target, _base, _env = installed
    tree = sorted(p.parent.relative_to(ROOT) for p in (ROOT / "skillstate").rglob("__init__.py"))
    missing = [str(p) for p in tree if not (target / p / "__init__.py").exists()]
    assert not missing, f"not installed (add to [tool.setuptools] packages): {missing}"
