"""Workspace tasks (issue 24): a coding agent changes a project in a directory, sandboxed, and a command
checks the result. `env: workspace` runs the bundled tasks, or your own (`data`)."""
