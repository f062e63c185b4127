"""run leases (one driver per run) and keyed event signatures

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_leases",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("holder", sa.String(256), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("mac", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_column("mac")
    op.drop_table("run_leases")
