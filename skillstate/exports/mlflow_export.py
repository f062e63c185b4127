"""Export a run to MLflow: `skillstate export-mlflow`.

One skillstate run becomes one MLflow run, found again by its tag
`skillstate.run_id` in the experiment:
- params: the run's config, flattened with dotted keys (`optimizer.model`),
  secrets masked (`skillstate.config.redact`), values cut to MLflow's length
  limit; no environment variable is read;
- step metrics, one point per decided step (x = the step):
  `candidate_score`, `early_reject_bound`, `current_score`, `best_score`,
  `edit_budget`, `epoch`, `decision` (see `DECISION_CODES`), `cost_usd`,
  `cumulative_cost_usd` (a fork's inherited steps included) and `calls`;
- summary metrics: the baseline's validation scores, the test reports
  (`test.best.hard`, `test.best.by_task_type.arithmetic.hard`, ...), the best
  step, the counts of decisions and the run's cost; with progressive
  disclosure, the trigger rates (`triggers.test_best.recall`, `.precision`,
  `.wrong_loads`, `.loads`, for `baseline`, `test_baseline` and `test_best`);
- a skill-bank run (`mode: bank`) also logs, per step, `bank.size` (skills in
  the current bank after the step), `bank.retrieval_hit_rate` (the share of
  the step's rollouts whose retrieval put at least one skill in the prompt)
  and, on validation steps, `bank.validation.gate` and
  `bank.validation.by_task_type.CATEGORY` (`skillstate.reading.bank_steps`);
  its `edit_budget` is left out (a bank step edits no document);
- artifacts: `skills/initial.md`, `skills/step_NNN.md` (the skill each
  accepted step made current), `skills/best.md`, for a fork
  `skills/fork_start.md` (a bank run's are its banks, `.json`), `curves.json`
  (`skillstate.reading.curves.run_curves`), and for a run of an Agent Skills
  directory `skills/NAME.skill`, its best skill as an archive that installs;
- tags: `skillstate.run_id`, `.kind`, `.status`, `.head` (SEQ:HASH of the
  run's last event, as `skillstate head` prints it), `.exported_steps`,
  `.database` (without its password), and for a fork `.parent_run_id`,
  `.fork_step`, `.overrides` and `mlflow.parentRunId`.

A fork is a child of its parent's MLflow run (nested; the parent is exported
or brought up to date first) and logs only its own steps, from its fork step
on: the steps it inherited are in the parent's run.

Exporting again never makes a second MLflow run: when the recorded head is
the run's head, nothing is written; when the run has grown since (it was
exported while in progress), only the steps after `skillstate.exported_steps`
are appended, and the summary, artifacts and tags brought up to date. A
recorded head that is not in the run's log (another database's run of the
same id, or a rewritten log) is refused.

A policy training run (kind policy) logs its training curves, validations,
evolutions and checkpoints instead: see `skillstate.exports.mlflow_policy`.

mlflow (the `mlflow` extra) is imported when an export starts.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from skillstate.errors import UserError
from skillstate.exports.mlflow_common import (
    HEAD_TAG,
    RUN_ID_TAG,
    STEPS_TAG,
    TAG,
    config_params,
    epoch_ms,
    metric_key,
    run_status,
)
from skillstate.reading.skill_text import skill_text
from skillstate.skilltree import is_tree_blob
from skillstate.util import install_hint

INSTALL_HINT = f"exporting to MLflow needs mlflow: {install_hint('mlflow')}"
DEFAULT_EXPERIMENT = "skillstate"
# MLflow's own default since 3.x (its file store needs an opt-in): a SQLite file in the working directory.
FALLBACK_TRACKING_URI = "sqlite:///mlflow.db"
DECISION_CODES = {"reject": -1, "skip": 0, "accept": 1, "accept_best": 2}
STEP_METRICS = ("candidate_score", "early_reject_bound", "current_score", "best_score", "edit_budget", "epoch",
                "cost_usd", "cumulative_cost_usd", "calls")
PARENT_TAG = "mlflow.parentRunId"
_BATCH = 100  # MLflow's limit of params or tags per log_batch (metrics: 1000)


def default_tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, else a SQLite file `mlflow.db` in the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or FALLBACK_TRACKING_URI


def _mlflow() -> Any:
    # MLflow reports usage to its developers unless told not to; skillstate sends nothing you did not ask for.
    # An explicit MLFLOW_DISABLE_TELEMETRY=false still wins.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        import mlflow
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return mlflow


@contextmanager
def _quiet() -> Iterator[None]:
    """MLflow and its migrations log at INFO on stderr when they create a tracking database: the library never
    prints, so they are held to warnings while exporting."""
    loggers = [logging.getLogger(name) for name in ("mlflow", "alembic")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(max(log.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


def _param_limit() -> int:
    try:
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
    except ImportError:  # pragma: no cover (older mlflow)
        return 500
    return int(MAX_PARAM_VAL_LENGTH)


def _summary_metrics(curves: dict[str, Any], state: Any) -> dict[str, float]:
    out: dict[str, float] = {}

    def put(key: str, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            out[metric_key(key)] = float(value)

    for name, value in (curves.get("baseline") or {}).items():
        if name != "n":
            put(f"baseline.{name}", value)
    for label, report in (curves.get("tests") or {}).items():
        for name in ("gate", "hard", "soft", "n"):
            put(f"test.{label}.{name}", report.get(name))
        for task_type, scores in (report.get("by_task_type") or {}).items():
            for name in ("hard", "soft", "n"):
                put(f"test.{label}.by_task_type.{task_type}.{name}", scores.get(name))
    for label, rates in (curves.get("triggers") or {}).items():  # progressive disclosure's trigger rates
        for name in ("recall", "precision", "wrong_loads", "loads"):
            put(f"triggers.{label}.{name}", rates.get(name))
    if curves.get("kind") != "eval":
        put("final.best_score", curves.get("best_score"))
        put("final.best_step", curves.get("best_step"))
        put("final.steps", state.last_completed_step)
        put("final.accepts", state.count("accept", "accept_best"))
        put("final.new_best", state.count("accept_best"))
        put("final.rejects", state.count("reject"))
        put("final.skips", state.count("skip"))
    put("final.cost_usd", curves.get("cost_usd"))
    put("final.calls", curves.get("calls"))
    put("final.own_cost_usd", curves.get("own_cost_usd"))
    return out


def _step_metrics(row: dict[str, Any]) -> dict[str, float]:
    out = {key: float(row[key]) for key in STEP_METRICS if isinstance(row.get(key), (int, float))}
    out["decision"] = float(DECISION_CODES.get(row["decision"], 0))
    return out


class _Exporter:
    def __init__(self, store: Any, client: Any, experiment_id: str):
        self.store = store
        self.client = client
        self.experiment_id = experiment_id
        self.done: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.param_limit = _param_limit()

    def find(self, run_id: str) -> Any | None:
        runs = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'",
                                       order_by=["attributes.start_time ASC"], max_results=10)
        return runs[0] if runs else None

    def export(self, run_id: str | None) -> dict[str, Any]:
        from skillstate.engine.runner import load_run
        from skillstate.reading.curves import run_curves
        from skillstate.reading.triggers import run_triggers

        loaded = load_run(self.store, run_id)
        if loaded.run_id in self.done:
            return self.done[loaded.run_id]
        state = loaded.state
        if state.kind == "policy":  # a policy training run: its training curves, validations and checkpoints
            from skillstate.exports.mlflow_policy import export_policy

            return self._finish(loaded.run_id, export_policy(self, loaded))
        parent = self.export(state.parent_run_id) if state.parent_run_id else None
        curves = run_curves(loaded)
        curves["triggers"] = run_triggers(self.store, state, loaded.lineage)
        seq, last_hash = loaded.log_position
        head = f"{seq}:{last_hash}"
        existing = self.find(loaded.run_id)
        if existing is not None:
            self.check_same_log(existing, loaded)
        fork_step = state.fork_step or 0
        decided = [row for row in curves["steps"]
                   if row.get("decision") is not None and row["step"] > fork_step]
        status, mlflow_status = run_status(state)
        tags = {RUN_ID_TAG: loaded.run_id, f"{TAG}kind": state.kind, f"{TAG}status": status, HEAD_TAG: head,
                f"{TAG}database": self.store.display_url, STEPS_TAG: str(decided[-1]["step"] if decided else fork_step),
                f"{TAG}decision_codes": ",".join(f"{k}={v}" for k, v in DECISION_CODES.items()),
                f"{TAG}gate_metric": str(state.config.get("gate_metric"))}
        if parent is not None:
            from skillstate.config import redact
            from skillstate.log.events import RunForked

            first = loaded.own[0].event if loaded.own else None
            overrides = first.overrides if isinstance(first, RunForked) else {}
            tags.update({PARENT_TAG: parent["mlflow_run_id"], f"{TAG}parent_run_id": state.parent_run_id or "",
                         f"{TAG}fork_step": str(fork_step),
                         f"{TAG}overrides": redact(json.dumps(overrides, sort_keys=True))[:5000]})
        result: dict[str, Any] = {"run_id": loaded.run_id, "head": head, "status": status,
                                  "parent_mlflow_run_id": parent["mlflow_run_id"] if parent else None,
                                  "steps_logged": 0, "metrics_logged": 0, "params_logged": 0, "artifacts_logged": 0}
        if existing is not None and existing.data.tags.get(HEAD_TAG) == head:
            result.update(mlflow_run_id=existing.info.run_id, action="unchanged",
                          exported_steps=int(existing.data.tags.get(STEPS_TAG, "0") or 0))
            return self._finish(loaded.run_id, result)

        times = {s.step: epoch_ms(s.created_at) for s in loaded.lineage
                 if s.type == "GateDecided" and s.step is not None}
        first_ms = epoch_ms(loaded.own[0].created_at if loaded.own else None)
        last_ms = epoch_ms(loaded.own[-1].created_at if loaded.own else None)
        if existing is None:
            run = self.client.create_run(self.experiment_id, start_time=first_ms, run_name=loaded.run_id,
                                         tags={RUN_ID_TAG: loaded.run_id})
            mlflow_run_id, done_steps, logged = run.info.run_id, fork_step, {}
            action = "created"
            params = config_params(dict(state.config), self.param_limit)
        else:
            mlflow_run_id = existing.info.run_id
            done_steps = int(existing.data.tags.get(STEPS_TAG, str(fork_step)) or fork_step)
            logged = dict(existing.data.metrics)
            action = "updated"
            params = {k: v for k, v in config_params(dict(state.config), self.param_limit).items()
                      if k not in existing.data.params}  # params are written once: MLflow refuses a change
        new_rows = [row for row in decided if row["step"] > done_steps]
        metrics = self._metrics(new_rows, times, curves, state, logged, last_ms, self._bank_metrics(loaded))
        tags["mlflow.note.content"] = self._note(loaded.run_id, curves, status, parent)
        self.log(mlflow_run_id, metrics, params, tags)
        artifacts = self._artifacts(mlflow_run_id, loaded, curves, new_rows, created=existing is None)
        if mlflow_status == "RUNNING":
            self.client.update_run(mlflow_run_id, status="RUNNING")
        else:
            self.client.set_terminated(mlflow_run_id, status=mlflow_status, end_time=last_ms)
        result.update(mlflow_run_id=mlflow_run_id, action=action, steps_logged=len(new_rows),
                      metrics_logged=len(metrics), params_logged=len(params), artifacts_logged=artifacts,
                      exported_steps=int(tags[STEPS_TAG]))
        return self._finish(loaded.run_id, result)

    def _finish(self, run_id: str, result: dict[str, Any]) -> dict[str, Any]:
        self.done[run_id] = result
        self.order.append(run_id)
        return result

    def check_same_log(self, existing: Any, loaded: Any) -> None:
        """The head recorded at the last export must be an event of this run's log."""
        recorded = existing.data.tags.get(HEAD_TAG, "")
        seq_text, _, recorded_hash = recorded.partition(":")
        by_seq = {s.seq: s.hash for s in loaded.own}
        if not seq_text.isdigit() or by_seq.get(int(seq_text)) != recorded_hash:
            raise UserError(
                f"MLflow run {existing.info.run_id} holds a run {loaded.run_id!r} whose last exported event "
                f"({recorded[:20] or 'none'}...) is not in this log (another database's run of that id, or a "
                f"rewritten log; it came from {existing.data.tags.get(f'{TAG}database', 'an unknown database')}): "
                "export to another --experiment")

    def _bank_metrics(self, loaded: Any) -> dict[int, dict[str, float]] | None:
        """A bank run's figures per step (None for other runs)."""
        if loaded.state.config.get("mode") != "bank":
            return None
        from skillstate.bank.document import read_bank
        from skillstate.reading.bank_steps import step_metrics

        sizes = {rec.step: len(read_bank(self.store.get_blob(rec.current_skill)).skills)
                 for rec in loaded.state.history if rec.current_skill}
        return step_metrics((s.event for s in loaded.lineage), sizes)

    def _metrics(self, rows: list[dict[str, Any]], times: dict[int, int], curves: dict[str, Any], state: Any,
                 logged: dict[str, float], last_ms: int, bank: dict[int, dict[str, float]] | None = None) -> list[Any]:
        from mlflow.entities import Metric

        out = []
        for row in rows:
            when = times.get(row["step"], last_ms)
            per_step = _step_metrics(row)
            if bank is not None:  # a bank step has no edit budget; it has a bank size, rates and retrieval hits
                per_step.pop("edit_budget", None)
                per_step.update({metric_key(k): v for k, v in bank.get(row["step"], {}).items()})
            for key, value in per_step.items():
                out.append(Metric(key, value, when, row["step"]))
        at = rows[-1]["step"] if rows else (state.last_completed_step if state.kind != "eval" else 0)
        for key, value in _summary_metrics(curves, state).items():
            if logged.get(key) != value:  # a summary figure is logged again only when it changed
                out.append(Metric(key, value, last_ms, at))
        return out

    def log(self, run_id: str, metrics: list[Any], params: dict[str, str], tags: dict[str, str]) -> None:
        from mlflow.entities import Param, RunTag

        param_list = [Param(k, v) for k, v in params.items()]
        tag_list = [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[i:i + 1000], synchronous=True)
        for i in range(0, max(len(param_list), len(tag_list)), _BATCH):
            self.client.log_batch(run_id, params=param_list[i:i + _BATCH], tags=tag_list[i:i + _BATCH],
                                  synchronous=True)

    def _note(self, run_id: str, curves: dict[str, Any], status: str, parent: dict[str, Any] | None) -> str:
        base = (curves.get("baseline") or {}).get("gate")
        best = curves.get("best_score")
        lines = [f"skillstate run `{run_id}` ({curves.get('kind')}, {status}) from {self.store.display_url}."]
        if base is not None and best is not None:
            lines.append(f"Validation {curves.get('gate_metric')}: baseline {base:.3f}, best {best:.3f} "
                         f"at step {curves.get('best_step')}.")
        if parent is not None:
            lines.append(f"Fork of `{curves.get('parent_run_id')}` at step {curves.get('fork_step')}: this run logs "
                         "its own steps; the steps before are in the parent run.")
        return "\n\n".join(lines)

    def _artifacts(self, mlflow_run_id: str, loaded: Any, curves: dict[str, Any], rows: list[dict[str, Any]],
                   created: bool) -> int:
        state = loaded.state
        files: dict[str, str] = {}
        records = {rec.step: rec for rec in state.history}
        ext = ".json" if state.config.get("mode") == "bank" else ".md"  # a bank is JSON, not a markdown document
        if created and state.initial_skill:
            files[f"skills/initial{ext}"] = state.initial_skill
        if created and state.fork_step and records.get(state.fork_step) and records[state.fork_step].current_skill:
            files[f"skills/fork_start{ext}"] = records[state.fork_step].current_skill
        for row in rows:
            rec = records.get(row["step"])
            if row["decision"] in ("accept", "accept_best") and rec is not None and rec.current_skill:
                files[f"skills/step_{row['step']:03d}{ext}"] = rec.current_skill
        if state.best_skill:
            files[f"skills/best{ext}"] = state.best_skill
        texts = self.store.get_blobs(sorted(set(files.values())))
        with tempfile.TemporaryDirectory(prefix="skillstate-mlflow-") as tmp:
            root = Path(tmp)
            for name, blob in files.items():
                path = root / name
                path.parent.mkdir(parents=True, exist_ok=True)
                text = texts[blob]  # a run that trains the whole directory: the tree's view, every file
                path.write_text(skill_text(self.store, blob) if is_tree_blob(text) else text, encoding="utf-8")
            (root / "curves.json").write_text(json.dumps(curves, indent=1, ensure_ascii=False, default=str),
                                              encoding="utf-8")
            archived = self._skill_archive(loaded, root / "skills") if state.skill_tree and state.best_skill else 0
            self.client.log_artifacts(mlflow_run_id, str(root))
        return len(files) + 1 + archived

    def _skill_archive(self, loaded: Any, folder: Path) -> int:
        """A run of an Agent Skills directory: its best skill as the archive
        `skills/NAME.skill`, which installs as is (none when it no longer
        passes the checks; `skillstate export` then says why)."""
        from skillstate.errors import UserError
        from skillstate.reading.skill_export import installable_skill
        from skillstate.skilltree import write_archive

        try:
            _, tree, name = installable_skill(self.store, loaded.run_id)
        except UserError:
            return 0
        write_archive(tree, folder / f"{name}.skill", name)
        return 1


def _sqlite_artifact_location(tracking_uri: str) -> str | None:
    """For a local SQLite tracking database, the artifacts of a new experiment go in `mlruns/` beside it (MLflow
    would put them under the working directory, wherever that is)."""
    if not tracking_uri.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url

    database = make_url(tracking_uri).database
    if not database or database == ":memory:":
        return None
    return (Path(database).expanduser().resolve().parent / "mlruns").as_uri()


def export_run(store: Any, run_id: str | None, *, tracking_uri: str | None = None,
               experiment: str = DEFAULT_EXPERIMENT) -> dict[str, Any]:
    """Export `run_id` (default: the latest training run), and for a fork its
    ancestors first, to the MLflow tracking server or store at `tracking_uri`
    (default `default_tracking_uri()`). Returns what was done, per run:
    `created`, `updated` (steps appended) or `unchanged`."""
    store.require_run(run_id)  # an unknown run is refused before MLflow is loaded
    _mlflow()
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from skillstate.config import redact

    uri = tracking_uri or default_tracking_uri()
    if not experiment.strip():
        raise UserError("--experiment must not be empty")
    try:
        with _quiet():
            client = MlflowClient(tracking_uri=uri)
            found = client.get_experiment_by_name(experiment)
            if found is not None and found.lifecycle_stage != "active":
                raise UserError(f"MLflow experiment {experiment!r} is deleted: restore it, or export to another "
                                "--experiment")
            experiment_id = found.experiment_id if found is not None else client.create_experiment(
                experiment, artifact_location=_sqlite_artifact_location(uri),
                tags={"skillstate.database": store.display_url})
            exporter = _Exporter(store, client, experiment_id)
            exporter.export(run_id)
    except MlflowException as err:
        first = (str(err.message if hasattr(err, "message") else err).strip().splitlines() or [""])[0]
        raise UserError(redact(f"MLflow ({uri}): {first}")) from None
    runs = [exporter.done[r] for r in exporter.order]
    return {"tracking_uri": redact(uri), "experiment": experiment, "experiment_id": experiment_id,
            "run_id": runs[-1]["run_id"], "runs": runs}
