"""Alembic environment: runs on the connection skillstate hands over."""

from alembic import context
from sqlalchemy import create_engine

from skillstate.storage.schema import metadata

connection = context.config.attributes.get("connection")


def _run(conn) -> None:
    context.configure(connection=conn, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if connection is not None:
    _run(connection)
else:  # plain `alembic -x url=...` usage
    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option("sqlalchemy.url")
    # ignore: without a URL create_engine raises, which is the error plain alembic usage should give
    with create_engine(url).begin() as conn:  # type: ignore[arg-type]
        _run(conn)
