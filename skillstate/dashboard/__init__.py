"""`skillstate dashboard`: a local, read-only web view of a database's runs
(the `dashboard` extra: Starlette, uvicorn and Jinja2)."""
