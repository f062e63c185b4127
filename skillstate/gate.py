"""Gate: the pure acceptance rule and the gate metric."""

from __future__ import annotations

ACCEPT_BEST = "accept_best"
ACCEPT = "accept"
REJECT = "reject"
SKIP = "skip"
ACCEPTED = {ACCEPT_BEST, ACCEPT}


def gate_score(hard: float, soft: float, metric: str, mixed_weight: float = 0.5) -> float:
    """hard, soft, or (1 - w) * hard + w * soft with w clamped to [0, 1]."""
    if metric == "hard":
        return hard
    if metric == "soft":
        return soft
    if metric == "mixed":
        w = min(max(mixed_weight, 0.0), 1.0)
        mixed = (1 - w) * hard + w * soft
        return min(max(mixed, min(hard, soft)), max(hard, soft))  # no rounding drift outside the bounds
    raise ValueError(f"unknown gate metric {metric!r}")


def decide(candidate: float, current: float, best: float) -> str:
    """Accept as new best iff strictly above best; accept iff strictly above
    current; otherwise reject (ties reject)."""
    if candidate > best:
        return ACCEPT_BEST
    if candidate > current:
        return ACCEPT
    return REJECT


# Leading words that make a line a directive, for the semantic-density bonus.
DIRECTIVES = frozenset({"must", "always", "never", "should", "avoid", "only", "do", "don't", "prefer", "require"})


def semantic_density(skill: str) -> float:
    """Share of the skill's content lines (not headings, not blank, not
    markers) whose first word is a directive such as MUST, ALWAYS or NEVER."""
    lines = []
    for raw in skill.splitlines():
        line = raw.strip().lstrip("-*+0123456789.) ").strip()
        if not line or raw.lstrip().startswith(("#", "<!--")):
            continue
        lines.append(line)
    if not lines:
        return 0.0
    directive = sum(1 for line in lines if line.split()[0].strip(":,;.!").lower() in DIRECTIVES)
    return directive / len(lines)


def with_density(score: float, density: float, weight: float) -> float:
    """The gate score plus the semantic-density bonus."""
    return score + weight * density
