"""The engine: decides the next stage from the folded state, calls the LLMs,
appends events."""
