"""An Agent Skill's own evals: reading them (`read`, with their typed assertions checked by `spec`),
splitting them into train, val and test (`split`) and the deterministic graders (`assertions`).

A pure library layer: it reads files and grades text, and calls no model and runs no environment.
Expectations and `llm-rubric` assertions are left for a judge, `command` assertions for a workspace.
"""

from skillstate.evals.assertions import AssertionResult, Graded, grade, scores
from skillstate.evals.read import (
    EVALS_FILE,
    TRIGGER_FILES,
    EvalFile,
    EvalItem,
    SkillEvals,
    TriggerEval,
    find_trigger_file,
    has_evals,
    read_eval_data_dir,
    read_evals_file,
    read_skill_evals,
    read_trigger_evals,
)
from skillstate.evals.spec import KNOWN_TYPES, Assertion, AssertionSpecError, parse_assertion
from skillstate.evals.split import DEFAULT_SIZES, Splits, split_evals, split_sizes

__all__ = [
    "DEFAULT_SIZES", "EVALS_FILE", "KNOWN_TYPES", "TRIGGER_FILES", "Assertion", "AssertionResult",
    "AssertionSpecError", "EvalFile", "EvalItem", "Graded", "SkillEvals", "Splits", "TriggerEval",
    "find_trigger_file", "grade", "has_evals", "parse_assertion", "read_eval_data_dir", "read_evals_file",
    "read_skill_evals", "read_trigger_evals", "scores", "split_evals", "split_sizes",
]
