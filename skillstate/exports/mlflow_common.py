"""What the MLflow exports of both kinds of run share: the tags a
skillstate run is found by, metric keys and timestamps as MLflow takes
them, the config as params (secrets masked) and the run's status.
`mlflow_export` exports skill runs, `mlflow_policy` policy runs; neither
module imports mlflow here.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

TAG = "skillstate."
RUN_ID_TAG, HEAD_TAG, STEPS_TAG = "skillstate.run_id", "skillstate.head", "skillstate.exported_steps"
_SECRET_KEY_RE = re.compile(r"(^|[._])(api_key|apikey|secret|password|passwd|token)$", re.IGNORECASE)
_BAD_KEY_CHARS_RE = re.compile(r"[^\w\-. /]")


def epoch_ms(when: dt.datetime | None) -> int:
    if when is None:
        return int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
    if when.tzinfo is None:  # SQLite hands back naive datetimes: skillstate stores UTC
        when = when.replace(tzinfo=dt.timezone.utc)
    return int(when.timestamp() * 1000)


def metric_key(key: str) -> str:
    return _BAD_KEY_CHARS_RE.sub("_", key)[:250]


def config_params(config: dict[str, Any], limit: int = 6000) -> dict[str, str]:
    """The config as MLflow params: dotted keys, string values, secrets masked, each value at most `limit`
    characters."""
    from skillstate.config import redact
    from skillstate.config_views import flatten_keys

    out: dict[str, str] = {}
    for key, value in sorted(flatten_keys(dict(config)).items()):
        if _SECRET_KEY_RE.search(key) and value:
            text = "***"
        elif isinstance(value, (dict, list)):
            text = redact(json.dumps(value, sort_keys=True, ensure_ascii=False))
        else:
            text = redact(str(value))
        if len(text) > limit:
            text = text[: limit - 3] + "..."
        out[metric_key(key)] = text
    return out


def run_status(state: Any) -> tuple[str, str]:
    """(skillstate status, MLflow run status)."""
    from skillstate.reading.history import status_of

    status = status_of(state)
    if state.completed:
        return status, "FINISHED"
    if state.stopped is not None:
        return status, "KILLED"
    return status, "RUNNING"
