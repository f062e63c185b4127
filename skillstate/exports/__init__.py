"""Carrying a run out of skillstate.

Training data for fine-tuning the target model (training_data), a run's steps
and metrics to MLflow (mlflow_export for skill runs, mlflow_policy for policy
runs, mlflow_common what they share), figures for papers (plots) and a copy
of runs into another database, verified by the audit (db_copy). These modules
sit on top of the library: they may import skillstate.reading,
skillstate.storage, skillstate.log, skillstate.skillopt, skillstate.config and
the engine's loading helpers, and their optional dependencies (mlflow,
matplotlib) load only inside them; nothing else in the library imports them
except the CLI.
"""
