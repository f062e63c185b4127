"""The event log and its pure fold.

The event types and their payloads (events, plus the event modules of repair,
final selection and prune), the value objects they carry (values), the codec
that turns events into rows and back (event_codec), the run state (state) and
the pure reducer that folds events into it (reducer, selection_fold,
prune_fold). Nothing here does I/O: this package imports only the standard
library, pydantic, skillstate.errors, skillstate.util, the pure parts of
skillstate.bank (skill documents, dedup) and skillstate.skillopt.gate (the
reducer applies the gate's pure accept rule). It never imports storage, the
engine or an LLM.
"""
