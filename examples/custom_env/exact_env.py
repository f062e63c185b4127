"""A worked example of your own environment: question answering where only
an exact answer counts (the built-in `qa` also accepts the answer inside a
longer reply).

Use it by naming it in a config (see config.yaml beside this file):

    PYTHONPATH=examples/custom_env skillstate run --config examples/custom_env/config.yaml

It keeps QA's data format (`id`, `question`, `answers`, ...) and prompt, and
changes the scoring; its one setting, `case_sensitive`, is read from the
config's `env_config` section and stored in the run's log.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from skillstate.envs import QAEnv, RolloutOutcome
from skillstate.envs.base import Complete
from skillstate.envs.qa import normalize, token_f1


class ExactConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    case_sensitive: bool = False


class ExactAnswerEnv(QAEnv):
    kind = "exact_answer"
    config_model = ExactConfig

    def default_skill(self) -> str:
        return "# Exact answers\n\nReply with the answer alone: no sentence around it, no explanation.\n"

    def rollout(self, skill: str, item: dict[str, Any], complete: Complete, prompts: dict[str, str]) -> RolloutOutcome:
        messages = [{"role": "system", "content": skill}, {"role": "user", "content": self.user_message(item, prompts)}]
        result = complete(messages)
        task_type = item.get("task_type", "")
        if not result.ok:
            return RolloutOutcome(0.0, 0.0, f"rollout_error: {result.error}", "", messages, task_type, result)
        reply = result.text.strip().rstrip(".")
        same = (lambda a, b: a == b) if self.config.case_sensitive else (lambda a, b: normalize(a) == normalize(b))
        hard = 1.0 if any(same(reply, answer) for answer in item["answers"]) else 0.0
        soft = max(token_f1(reply, answer) for answer in item["answers"])
        reason = "" if hard else f"not exactly an answer: expected {item['answers'][0]!r}, got {reply[:200]!r}"
        convo = messages + [{"role": "assistant", "content": result.text}]
        return RolloutOutcome(hard, soft, reason, result.text, convo, task_type, result)
