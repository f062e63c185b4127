"""The sim backend: one LLMClient that plays both the target and the optimizer.

Which role a request is for is read off the request itself: optimizer
prompts carry tagged sections (`<failures>`, `<patches>`, ...), target
requests are a skill plus a question. Every reply is a deterministic function
of the request, so a sim run is reproducible bit for bit.
"""

from __future__ import annotations

from skillstate.llm.base import ChatRequest, ChatResponse
from skillstate.sim.optimizer import SimOptimizer, _tokens
from skillstate.sim.world import SimWorld
from skillstate.util import hash_value, seeded_rng


class SimBackend:
    """LLMClient for both roles of the simulated world."""

    name = "sim"

    def __init__(self, world: SimWorld):
        self.world = world
        self.optimizer = SimOptimizer(world)

    def respond(self, messages: list[dict[str, str]]) -> str:
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        if "<skill>" in user:
            return self.optimizer.reply(user, seeded_rng("sim-optimizer", hash_value(messages)))
        return self.world.answer(system, user)

    def complete(self, request: ChatRequest) -> ChatResponse:
        messages = request.message_dicts()
        text = self.respond(messages)
        prompt_tokens = sum(_tokens(m["content"]) for m in messages)
        return ChatResponse(text=text, prompt_tokens=prompt_tokens, completion_tokens=_tokens(text),
                            finish_reason="stop")
