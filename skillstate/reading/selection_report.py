"""The val-to-test gap of a run, for its summary (`show`, `show --json`,
the run's end) and the dashboard's run page: the best val score minus the
final skill's test score (both in the gate metric), and, when the final
selection picked the skill (`final_selection.enabled`), its selection score
against its test score and each candidate it was picked from."""

from __future__ import annotations

from typing import Any

from skillstate.log.selection_events import FinalSelected, SelectionScored
from skillstate.log.state import RunState


def gap_summary(state: RunState) -> dict[str, Any] | None:
    """The gap as plain data: None in an evaluation run, or before both the
    final skill's test evaluation and the final selection (with `eval_test:
    false` the selection is there and the test fields are None)."""
    test = state.tests.get("best")
    sel = state.final_selection
    best_val = sel.best_val if sel is not None else state.best_score
    if state.kind != "train" or (test is None and sel is None) or best_val is None:
        return None
    score = test.scores.gate if test is not None else None
    out: dict[str, Any] = {
        "metric": state.config.get("gate_metric"), "best_val": best_val, "final_step": state.best_step,
        "final_val": state.best_score, "test": score, "val_to_test_gap": None if score is None else best_val - score,
        "selection": None,
    }
    if sel is not None:
        out["selection"] = {
            "split": sel.split, "n": state.selection_scored[sel.chosen].scores.n if state.selection_scored else None,
            "chosen": sel.chosen, "score": sel.selection_score,
            "selection_to_test_gap": None if score is None else sel.selection_score - score,
            "picked_over_best_val": sel.chosen != 0, "reason": sel.reason,
            "candidates": [c.model_dump() for c in sel.candidates],
        }
    return out


def gap_lines(gap: dict[str, Any] | None) -> list[str]:
    """The summary's lines on the gap (none before the test evaluation or the final selection)."""
    if not gap:
        return []
    sel = gap["selection"]
    if gap["test"] is None:
        lines = [f"best val {gap['best_val']:.3f} ({gap['metric']}); the final skill (step {gap['final_step']}) was "
                 "not scored on test (eval_test: false)"]
    else:
        lines = [f"val-to-test gap {gap['val_to_test_gap']:+.3f} ({gap['metric']}): best val {gap['best_val']:.3f}, "
                 f"final skill (step {gap['final_step']}) test {gap['test']:.3f}"]
    if sel is None:
        return lines
    held = f"final selection on {sel['split']} ({sel['n']} items, held out from the gate): {sel['score']:.3f} there"
    lines.append(held if gap["test"] is None else
                 f"{held}, test {gap['test']:.3f}: gap {sel['selection_to_test_gap']:+.3f}")
    for rank, c in enumerate(sel["candidates"]):
        mark = "picked" if rank == sel["chosen"] else ""
        lines.append(f"  step {c['step']:>3}  val {c['val_score']:.3f}  {sel['split']} {c['selection_score']:.3f}  "
                     f"{mark}".rstrip())
    return lines


def event_summary(ev: SelectionScored | FinalSelected) -> str:
    """One line for `skillstate log` and the run's progress."""
    if isinstance(ev, SelectionScored):
        cached = " (score cache)" if ev.cached else ""
        return (f"candidate {ev.rank + 1}: step {ev.from_step}'s skill, val {ev.val_score:.4f}, {ev.split} "
                f"{ev.scores.gate:.4f}{cached}")
    return f"step {ev.from_step}'s skill of {len(ev.candidates)}: {ev.reason}"
