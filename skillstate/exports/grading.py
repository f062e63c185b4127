"""A judged run's test gradings in the layout skill-creator's review tools read: one folder per eval,
`eval-<id>/<configuration>/grading.json` beside `outputs/output.md` (what the target wrote), where the
configuration is `with_skill` (the trained skill), `old_skill` (the skill the run started from) and
`without_skill` (no skill at all), as the run's test evaluations hold them."""

from __future__ import annotations

import json
import re

from skillstate.engine.loading import judged, load_run
from skillstate.errors import UserError
from skillstate.reading.grading import grading_json, item_gradings
from skillstate.storage.store import Store

CONFIGURATIONS = {"best": "with_skill", "baseline": "old_skill", "no_skill": "without_skill", "eval": "with_skill"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def grading_files(store: Store, run_id: str | None) -> tuple[str, dict[str, str]]:
    """(the run's id, relative path -> text) of every grading of the run's test evaluations."""
    loaded = load_run(store, run_id)
    state = loaded.state
    if not judged(str(state.config.get("env", "qa"))):
        raise UserError(f"run {loaded.run_id!r} is not graded by a judge (env evals): it has no gradings to write")
    found = [label for label in CONFIGURATIONS if label in state.tests]
    if not found:
        raise UserError(f"run {loaded.run_id!r} has no test evaluation yet (eval_test scores the skills at the end)")
    files: dict[str, str] = {}
    for label in found:
        for item in item_gradings(store, state.tests[label].results):
            folder = f"eval-{_UNSAFE.sub('_', item['item_id'])}/{CONFIGURATIONS[label]}"
            files[f"{folder}/grading.json"] = json.dumps(grading_json(item), indent=2, ensure_ascii=False) + "\n"
            files[f"{folder}/outputs/output.md"] = item["prediction"] + ("\n" if item["prediction"] else "")
    return loaded.run_id, files
