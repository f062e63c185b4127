"""runs.kind of evaluation runs: rows written before 0.3 said train

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # An evaluation run's first event is its RunStarted with "kind":"eval" (canonical JSON, no spaces).
    op.execute(
        "UPDATE runs SET kind = 'eval' WHERE run_id IN (SELECT run_id FROM events "
        "WHERE seq = 1 AND type = 'RunStarted' AND payload LIKE '%\"kind\":\"eval\"%')"
    )


def downgrade() -> None:
    pass
