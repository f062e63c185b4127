"""The sim's noisy mode: what makes the simulated world harder to learn in.

Each property is one knob (config keys `sim.*`, all off by default, so a
default run is what it always was):

- `answer_noise`: the share of the target's answers drawn from the request
  (the whole skill and the question) rather than from the item alone. Such
  an answer is right with the same chance as before, but a skill that
  differs by one word draws again, as a real model's would. The draw is a
  function of the request, so the same request always gets the same reply.
- `harmful_edits`: how often the optimizer proposes, for a failing task
  type, a rule that sounds right but breaks another task type; a target
  whose skill holds such a rule answers that other type right `harm_factor`
  times as often. Half of them also state the right rule for their own type,
  so they lift one type while they break another.
- `paraphrases`: how often the optimizer proposes a rule the skill already
  has, in other words: it changes no item's chance, only the skill's length.
- `rank_noise`: how little the ranking of the select stage knows; 0 ranks as
  before, 1 ranks at random.
- `length_penalty`: the share of the chance lost per 100 characters of the
  skill beyond `length_free_chars`.
- `blocking`: how often the optimizer, proposing the right rule for a failing
  task type, proposes with it a broad line that overrides another task type:
  while the skill holds it, that type is answered right with the chance
  `block_level`, whatever else the skill holds (`skillstate.sim.blockers`).

`noise: moderate` turns the first five on at the levels of `MODERATE`;
`noise: blocking` does the same and turns `blocking` on too (`BLOCKING`). Each
key set explicitly keeps its value.
"""

from __future__ import annotations

from dataclasses import dataclass

from skillstate.util import hash_value

MODERATE = {"answer_noise": 0.7, "harmful_edits": 0.25, "harm_factor": 0.35, "paraphrases": 0.25,
            "rank_noise": 0.8, "length_penalty": 0.04}
BLOCKING = {**MODERATE, "blocking": 0.5}
KNOBS = ("answer_noise", "harmful_edits", "harm_factor", "paraphrases", "rank_noise", "length_penalty",
         "length_free_chars")
LATER_KNOBS = ("blocking", "block_level")  # in the tag only when blocking is on, so older tags stay as they were
PRESETS = {"moderate": MODERATE, "blocking": BLOCKING}


@dataclass(frozen=True)
class SimNoise:
    answer_noise: float = 0.0
    harmful_edits: float = 0.0
    harm_factor: float = 0.35
    paraphrases: float = 0.0
    rank_noise: float = 0.0
    length_penalty: float = 0.0
    length_free_chars: int = 600
    blocking: float = 0.0
    block_level: float = 0.1

    @classmethod
    def of(cls, config: object | None) -> SimNoise:
        """The noise a config's `sim` section asks for (anything with the knobs as attributes); none for None."""
        if config is None:
            return cls()
        return cls(**{k: getattr(config, k) for k in KNOBS + LATER_KNOBS})

    @property
    def on(self) -> bool:
        return any((self.answer_noise, self.harmful_edits, self.paraphrases, self.rank_noise, self.length_penalty,
                    self.blocking))

    @property
    def proposals_on(self) -> bool:
        return bool(self.harmful_edits or self.paraphrases)

    def tag(self) -> str:
        """A short name of these settings, to tell the noisy sim's models apart from the clean one's."""
        values: list = [getattr(self, k) for k in KNOBS]
        if self.blocking:
            values.append({k: getattr(self, k) for k in LATER_KNOBS})
        return "noisy-" + hash_value(values)[:8] if self.on else ""

    def length_factor(self, skill: str) -> float:
        """What a skill of this length keeps of the chance of a right answer."""
        excess = len(skill) - self.length_free_chars
        if not self.length_penalty or excess <= 0:
            return 1.0
        return max(0.0, 1.0 - self.length_penalty * excess / 100)


OFF = SimNoise()
