"""The package layout (issue 22): the names the README's Python API section uses keep working."""

import importlib


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
