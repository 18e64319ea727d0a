"""The migrations' revision ids before they were renumbered in chain order, and what each is now.

Revisions 0003 to 0016 were once numbered 0013 to 0026 and ran out of numeric order, so a
listing of migrations/versions read them in the wrong order. Databases deployed before the
renumbering are stamped with the earlier ids; `renumbered` gives the id the same migration has
now. No earlier id equals any current one, so an id is never taken for the wrong migration.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# Earlier id -> current id, in the order the migrations run (0001 and 0002 kept theirs).
RENUMBERED: Mapping[str, str] = MappingProxyType(
    {
        "0016_review_findings": "0003_review_findings",
        "0017_status_reports": "0004_status_reports",
        "0014_report_views": "0005_report_views",
        "0015_engines": "0006_engines",
        "0013_operations": "0007_operations",
        "0018_status_outbox": "0008_status_outbox",
        "0019_fencing": "0009_fencing",
        "0020_fencing_contract": "0010_fencing_contract",
        "0021_dispatch_backlog": "0011_dispatch_backlog",
        "0022_eta_model": "0012_eta_model",
        "0023_forge_budgets": "0013_forge_budgets",
        "0024_review_costs": "0014_review_costs",
        "0025_retry_columns": "0015_retry_columns",
        "0026_retry_columns_contract": "0016_retry_columns_contract",
    }
)


def renumbered(revision: str) -> str:
    """The current id of `revision` when it is an earlier one; any other id or target
    (`head`, `base`, a current id, `head-1`) unchanged."""
    return RENUMBERED.get(revision, revision)


__all__ = ["RENUMBERED", "renumbered"]
