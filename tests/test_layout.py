"""The package layout (issue 22): the names the Python API guide (docs/python-api.md) and the
architecture page (docs/architecture.md) use keep working."""

import importlib
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def resolve(dotted: str) -> object:
    """A module, or an attribute of the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(dotted)


def test_readme_python_api_names_still_import():
    import skillstate
    from skillstate.reading import audit as new_audit
    from skillstate.reading import history as new_history

    for name in ("SkillConfig", "Trainer", "Store", "open_store", "build_config", "evaluate_skill", "RunResult"):
        assert getattr(skillstate, name) is not None
    old_history = importlib.import_module("skillstate.history")
    old_audit = importlib.import_module("skillstate.audit")
    assert old_history.replay is new_history.replay
    assert old_audit.audit is new_audit.audit and old_audit.verify is new_audit.verify


def test_the_names_the_docs_give_resolve():
    """Every `skillstate.a.b` the Python API guide, the environments guide and the architecture page
    name in code, and every `from skillstate import ...` of the guide, is there."""
    named = set()
    for page in ("python-api.md", "environments.md", "architecture.md"):
        text = (DOCS / page).read_text(encoding="utf-8")
        named |= set(re.findall(r"`(skillstate(?:\.[A-Za-z_]\w*)+)", text))
        for names in re.findall(r"(?m)^from skillstate import (.+)$", text):
            named |= {f"skillstate.{name.strip()}" for name in names.split(",")}
    assert {"skillstate.history.replay", "skillstate.Trainer", "skillstate.log.events"} <= named
    missing = []
    for dotted in sorted(named):
        try:
            resolve(dotted)
        except (ImportError, AttributeError):
            missing.append(dotted)
    assert not missing, missing
