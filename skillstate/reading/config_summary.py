"""The headline of a run's config (what the dashboard shows at the top of a
run): environment, mode, seed, backend and the model of each role, and the
whole config as indented JSON. The stored config holds no secret (keys are
named by their environment variable, never held), and the JSON is passed
through `redact` once more so that a credential pasted into a URL never
shows."""

from __future__ import annotations

import json
from typing import Any

from skillstate.config import SIM_MODELS
from skillstate.util import redact


def config_summary(config: dict[str, Any]) -> dict[str, Any]:
    backend = config.get("backend") or "sim"

    def model(role: str) -> str | None:
        chosen = (config.get(role) or {}).get("model")
        return chosen or (SIM_MODELS.get(role) if backend == "sim" else None)

    return {
        "env": config.get("env"), "mode": config.get("mode", "skill"), "seed": config.get("seed"),
        "backend": backend, "models": {role: model(role) for role in ("target", "optimizer")},
        "full": redact(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False, default=str)),
    }
