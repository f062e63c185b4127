"""A plain (non-editable) `pip install .` works: console script, prompts and
migrations ship in the package, and no bare `cli`/`migrations` is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
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
    env_dir = base / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps",
                    "--no-build-isolation", str(src)], check=True, capture_output=True)
    return env_dir, base


def test_installed_package_creates_its_database_and_runs(installed):
    env_dir, base = installed
    work = base / "elsewhere"
    work.mkdir()
    exe = env_dir / "bin" / "skillstate"
    up = subprocess.run([str(exe), "db", "upgrade", "--db", "sqlite:///fresh.db"], cwd=work, capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    assert "upgraded from empty" in up.stdout
    run = subprocess.run([str(exe), "run", "--epochs", "1", "-q"], cwd=work, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "completed" in run.stdout and (work / "skillstate.db").exists()


def test_installed_layout(installed):
    env_dir, base = installed
    code = ("import skillstate, skillstate.cli, skillstate.migrations, importlib.util as u, json;"
            "print(json.dumps([skillstate.__file__, skillstate.migrations.__file__,"
            " u.find_spec('cli') is None, u.find_spec('migrations') is None]))")
    out = subprocess.run([str(env_dir / "bin" / "python"), "-c", code], cwd=base, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    import json

    pkg, migrations, no_cli, no_migrations = json.loads(out.stdout)
    assert str(env_dir) in pkg and str(env_dir) in migrations
    assert (Path(migrations).parent / "versions" / "0001_initial.py").exists()
    assert (Path(pkg).parent / "prompts" / "failure_analyst.md").exists()
    assert no_cli and no_migrations
