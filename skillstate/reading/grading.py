"""What the log says about grading, for a run whose environment grades with a judge (env evals): each
item's checks with their verdicts and evidence, the judge's agreement, each check's pass rate per
skill on test, and skill-creator's `grading.json` of an item.

Everything is read from the trajectories the rollouts stored; nothing here calls a model.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from skillstate.log.reducer import RunState
from skillstate.storage.store import Store

# How `show` and the export name the test evaluations (TestEvaluated labels).
TEST_LABELS = {"no_skill": "no skill", "baseline": "initial skill", "best": "trained skill", "eval": "skill"}


def gradings(store: Store, results: list[Any]) -> dict[str, dict[str, Any]]:
    """item id -> the `grading` its trajectory recorded (env evals: `checks`, `agreement`, `judge_error`), for
    results (`ItemResult`s or their dumps) whose trajectories hold one."""
    def trajectory(r: Any) -> str | None:
        return r.get("trajectory") if isinstance(r, dict) else r.trajectory

    blobs = store.get_blobs([h for r in results if (h := trajectory(r))])
    out = {}
    for r in results:
        raw = blobs.get(trajectory(r) or "")
        data = json.loads(raw) if raw and raw.startswith("{") else {}
        if isinstance(data.get("grading"), dict):
            out[r["item_id"] if isinstance(r, dict) else r.item_id] = data["grading"]
    return out


def item_gradings(store: Store, results_blob: str) -> list[dict[str, Any]]:
    """Each result of a results blob with its checks: `{"item_id", "hard", "soft", "prediction",
    "fail_reason", "checks": [{"kind", "text", "passed", "evidence", "votes", "weight"}], "agreement",
    "judge_error"}` (checks empty for a result whose trajectory holds no grading)."""
    results = json.loads(store.get_blob(results_blob))
    found = gradings(store, results)
    out = []
    for r in results:
        grading = found.get(r["item_id"], {})
        out.append({"item_id": r["item_id"], "hard": r["hard"], "soft": r["soft"],
                    "prediction": r.get("prediction", ""), "fail_reason": r.get("fail_reason", ""),
                    "checks": grading.get("checks", []), "agreement": grading.get("agreement"),
                    "judge_error": grading.get("judge_error")})
    return out


def judge_agreement(items: list[dict[str, Any]]) -> dict[str, Any]:
    """How far the judge can be trusted on these items: `samples` (the share of its statements every sample
    graded alike, over items graded more than once), `assertions` (over items with both judge statements and
    deterministic assertions: the share where the judge passed all its statements exactly when the assertions
    all passed), the counts behind both, and the items whose judge reply could not be used."""
    several = [c for item in items for c in item["checks"] if len(c.get("votes") or []) > 1]
    both = [(judged, local) for item in items
            if (judged := [c for c in item["checks"] if c["kind"] in ("expectation", "llm-rubric")])
            and (local := [c for c in item["checks"] if c["kind"] == "assertion"])]
    alike = sum(all(c["passed"] for c in judged) == all(c["passed"] for c in local) for judged, local in both)
    return {
        "samples": sum(len(set(c["votes"])) == 1 for c in several) / len(several) if several else None,
        "statements_sampled": len(several),
        "assertions": alike / len(both) if both else None,
        "items_with_both": len(both),
        "judge_errors": sum(1 for item in items if item["judge_error"]),
    }


def check_rates(store: Store, state: RunState) -> dict[str, Any]:
    """Each check's pass rate per test evaluation of the run (`TestEvaluated` labels), and the judge's
    agreement over them: `{"labels": [...], "rows": [{"check", "kind", "rates": {label: (passed, n)}}],
    "agreement": ...}`."""
    labels = [label for label in ("no_skill", "baseline", "best", "eval") if label in state.tests]
    counts: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(dict)
    graded: list[dict[str, Any]] = []
    for label in labels:
        items = item_gradings(store, state.tests[label].results)
        graded += items
        for item in items:
            for c in item["checks"]:
                seen = counts[(c["kind"], c["text"])].setdefault(label, [0, 0])
                seen[0] += bool(c["passed"])
                seen[1] += 1
    rows = [{"check": text, "kind": kind, "rates": {k: tuple(v) for k, v in per.items()}}
            for (kind, text), per in counts.items()]
    return {"labels": labels, "rows": rows, "agreement": judge_agreement(graded)}


def grading_json(item: dict[str, Any]) -> dict[str, Any]:
    """One graded item in the shape skill-creator's grading.json has (its viewer reads `expectations` and
    `summary`): every check, the deterministic assertions included, as an expectation with its evidence."""
    checks = [c for c in item["checks"] if c.get("weight", 1) > 0 and c.get("passed") is not None]
    passed = sum(1 for c in checks if c["passed"])
    return {
        "expectations": [{"text": c["text"], "passed": bool(c["passed"]), "evidence": c.get("evidence", "")}
                         for c in checks],
        "summary": {"passed": passed, "failed": len(checks) - passed, "total": len(checks),
                    "pass_rate": round(passed / len(checks), 4) if checks else 0.0},
        "execution_metrics": {"output_chars": len(item["prediction"]), "errors_encountered":
                              1 if item["judge_error"] else 0},
    }
