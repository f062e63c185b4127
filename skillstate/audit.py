"""Old path of skillstate.reading.audit, kept because the README's Python API names
`skillstate.audit.audit` and `skillstate.audit.verify`: re-exports the public names; new code
imports skillstate.reading.audit."""

from skillstate.reading.audit import AuditReport, Head, VerifyReport, audit, head, parse_head, verify

__all__ = ["AuditReport", "Head", "VerifyReport", "audit", "head", "parse_head", "verify"]
