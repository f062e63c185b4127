"""A worked example of your own environment: question answering where only
an exact answer counts (the built-in `qa` also accepts the answer inside a
longer reply).

Use it by naming it in a config (see config.yaml beside this file):

    PYTHONPATH=examples/custom_env skillstate run --config examples/custom_env/config.yaml

It keeps QA's data format (`id`, `question`, `answers`, ...), prompt and
rollout, and changes the scoring (`score`); its one setting,
`case_sensitive`, is read from the config's `env_config` section and stored
in the run's log. A new kind of task overrides `rollout` itself.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from skillstate.envs import QAEnv
from skillstate.envs.qa import normalize, token_f1


class ExactConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    case_sensitive: bool = False


class ExactAnswerEnv(QAEnv):
    kind = "exact_answer"
    config_model = ExactConfig

    def default_skill(self) -> str:
        return "# Exact answers\n\nReply with the answer alone: no sentence around it, no explanation.\n"

    def score(self, prediction: str, item: dict[str, Any]) -> tuple[float, float, str]:
        reply = prediction.strip().rstrip(".")
        answers = item["answers"]
        if self.config.case_sensitive:
            hard = float(reply in answers)
        else:
            hard = float(any(normalize(reply) == normalize(answer) for answer in answers))
        soft = max(token_f1(reply, answer) for answer in answers)
        return hard, soft, "" if hard else f"not exactly an answer: expected {answers[0]!r}, got {reply[:200]!r}"
