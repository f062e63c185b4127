"""What the text worlds need on the machine: their Python package and a Java
runtime on PATH (each world is a JVM that py4j starts with the `java` on
PATH). Every failure is a one-line ConfigError naming what to install."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
from functools import lru_cache
from types import ModuleType

from skillstate.errors import ConfigError
from skillstate.util import install_hint

# The jars of textworld-express 1.1.0 and scienceworld 1.2.3 are Java 8
# bytecode (class file version 52) and both READMEs ask for Java 1.8+.
MIN_JAVA = 8
JAVA_HINT = "apt install openjdk-17-jre-headless"
EXTRA_HINT = install_hint("textworlds")

_VERSION = re.compile(r'version\s+"?(\d+)(?:\.(\d+))?')


def java_major(text: str) -> int | None:
    """The major version in the output of `java -version`: 'version "17.0.15"'
    is 17, 'version "1.8.0_292"' is 8."""
    match = _VERSION.search(text)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


@lru_cache(maxsize=8)
def _probe(java: str) -> tuple[int | None, str]:
    """(major version, what went wrong) of the java executable at `java`."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"`{java} -version` failed ({type(err).__name__})"
    text = (done.stderr or "") + (done.stdout or "")
    if done.returncode != 0:
        return None, f"`{java} -version` exited with code {done.returncode}"
    major = java_major(text)
    return major, "" if major is not None else f"cannot read the version in `{java} -version`"


def require_java(env_name: str, minimum: int = MIN_JAVA) -> int:
    """The major version of the `java` on PATH; a ConfigError when there is
    none, it does not run, or it is older than `minimum`."""
    need = f"env {env_name} needs Java {minimum}+ on PATH (`{JAVA_HINT}`)"
    java = shutil.which("java", path=os.environ.get("PATH", os.defpath))
    if java is None:
        raise ConfigError(f"{need}: no java found")
    major, problem = _probe(os.path.realpath(java))
    if major is None:
        raise ConfigError(f"{need}: {problem}")
    if major < minimum:
        raise ConfigError(f"{need}: {java} is Java {major}")
    return major


def require_package(env_name: str, module: str) -> ModuleType:
    """The world's Python package; a ConfigError naming the extra to install
    when it is missing."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in (module, "py4j"):
            raise ConfigError(f"env {env_name} needs the textworlds extra: {EXTRA_HINT}") from None
        raise ConfigError(f"env {env_name}: cannot import {module}: {err}") from None
    except Exception as err:  # the package's own error at import time
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ConfigError(f"env {env_name}: cannot import {module}: {type(err).__name__}: {first}") from None
