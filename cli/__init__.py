"""The click command line (installed as skillstate.cli)."""
