"""The sim backend: one LLMClient that plays both the target and the optimizer.

Which role a request is for is read off the request itself: optimizer
prompts carry tagged sections (`<failures>`, `<patches>`, ...) or, from
other programs, a skill section followed by trajectories, patches or an edit
pool under markdown headings (`sim.reading`); target requests are a skill
plus a question. Every reply is a deterministic function
of the request, so a sim run is reproducible bit for bit.
"""

from __future__ import annotations

from typing import Any

from skillstate.envs.base import SkillEnv
from skillstate.errors import ConfigError
from skillstate.llm.base import ChatRequest, ChatResponse, ToolCall
from skillstate.reading.tool_use import PROBE_TOOL
from skillstate.sim.noise import SimNoise
from skillstate.sim.optimizer import SimOptimizer, _tokens
from skillstate.sim.reading import read_request
from skillstate.sim.world import SimWorld
from skillstate.util import hash_value, seeded_rng


class SimBackend:
    """LLMClient for both roles of the simulated world."""

    name = "sim"

    def __init__(self, world: Any, judge_error: float = 0.0):
        self.world = world
        self.optimizer = SimOptimizer(world)
        self.judge_error = judge_error  # env evals: how often the sim judge's verdict is wrong

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                seed: int | None = None) -> ChatResponse:
        return self.answer(messages, tools, seed)[1]

    def answer(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               seed: int | None = None) -> tuple[str, ChatResponse]:
        """(the role that answered, "target", "optimizer" or "judge"; the reply). A `seed` (a sample's index)
        makes the question-answering target answer, and the judge grade, as another sample would."""
        user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        calls: list[ToolCall] = []
        role = "optimizer"
        if any(t.get("function", {}).get("name") == PROBE_TOOL for t in tools or []):  # the start-up tool check
            role, text, calls = "target", "", [ToolCall("call_probe", PROBE_TOOL, "{}")]
        elif not tools and "<expectations>" in str(user or "") and "<output>" in str(user or ""):  # env evals:
            from skillstate.sim.evals_world import judge_reply  # the judge grades an output

            role, text = "judge", judge_reply(messages, seed, self.judge_error)
        elif not tools and ("<skill>" in user or "<bank>" in user):  # the optimizer's prompts (the bank's teacher
            # too), which never offer tools: an agent CLI's request that lists its skills in <skill> tags does
            text = self.optimizer.reply(user, seeded_rng("sim-optimizer", hash_value(messages)))
        elif (request := read_request(str(user or ""), self.world)) is not None:
            text = self.optimizer.reply_to(request, str(user), seeded_rng("sim-optimizer", hash_value(messages)))
        else:
            role = "target"
            text, calls = (self.world.reply(messages, tools or []) if seed is None
                           else self.world.reply(messages, tools or [], seed=seed))
        prompt_tokens = sum(_tokens(str(m.get("content") or "")) for m in messages)
        out_tokens = _tokens(text) + sum(_tokens(c.arguments) for c in calls)
        return role, ChatResponse(text=text, prompt_tokens=prompt_tokens, completion_tokens=out_tokens,
                                  finish_reason="tool_calls" if calls else "stop", tool_calls=tuple(calls))

    def complete(self, request: ChatRequest) -> ChatResponse:
        return self.respond(request.message_dicts(), request.tool_list(), request.seed)


def sim_world_for(env: SkillEnv, sim: Any = None) -> Any:
    """The simulated world that plays `env`'s target, or a ConfigError when
    the sim backend has none for this kind of environment. `sim`: the config's
    `sim` section (its noisy mode; question answering only)."""
    from skillstate.envs.episode import EpisodeEnv
    from skillstate.envs.qa import QAEnv
    from skillstate.envs.tools import ToolEnv

    noise = SimNoise.of(sim)
    from skillstate.envs.disclosure import DisclosureEnv

    if isinstance(env, DisclosureEnv):  # progressive disclosure: the sim plays the wrapped environment's world
        env = env.inner
    if isinstance(env, QAEnv):
        return SimWorld([item for items in env.splits.values() for item in items], noise)
    if noise.on:
        raise ConfigError(f"the sim's noisy mode (sim.*) plays question answering only, not env {env.kind!r}: "
                          "leave sim.noise off")
    if getattr(env, "uses_judge", False):
        from skillstate.sim.evals_world import EvalsWorld

        return EvalsWorld(env)
    from skillstate.envs.workspace.env import WorkspaceEnv

    if isinstance(env, WorkspaceEnv):
        from skillstate.sim.coder import CoderWorld

        return CoderWorld(env)
    if isinstance(env, EpisodeEnv):
        from skillstate.sim.agents import EpisodeWorld

        return EpisodeWorld(env)
    if isinstance(env, ToolEnv):
        from skillstate.sim.agents import ToolWorld

        return ToolWorld(env)
    raise ConfigError(f"the sim backend cannot play env {env.kind!r}: it plays question answering, text worlds "
                      "(EpisodeEnv), tool use (ToolEnv) and workspace tasks; use --backend openai")


def sim_backend_for(env: SkillEnv, sim: Any = None) -> SimBackend:
    return SimBackend(sim_world_for(env, sim), judge_error=getattr(sim, "judge_error", 0.0))
