"""The migrations' numbers follow their chain, and every earlier id maps onto it in order."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from alembic.script import ScriptDirectory

from bot.db import alembic_config
from bot.migration_ids import RENUMBERED, renumbered


def _chain() -> list[tuple[str, str]]:
    """(revision id, file stem) of every migration, in the order they run."""
    script = ScriptDirectory.from_config(alembic_config("postgresql://unused/none"))
    revisions = list(reversed(list(script.walk_revisions("base", "heads"))))
    assert len(script.get_heads()) == 1 and revisions[0].down_revision is None
    for before, after in pairwise(revisions):
        assert after.down_revision == before.revision
    return [(revision.revision, Path(str(revision.path)).stem) for revision in revisions]


def test_files_are_numbered_in_the_order_they_run() -> None:
    chain = _chain()
    assert [int(stem[:4]) for _, stem in chain] == list(range(1, len(chain) + 1))
    # 0001 and 0002 kept the bare numbers they were deployed with; every later id is its stem.
    assert [revision for revision, _ in chain[:2]] == ["0001", "0002"]
    assert all(revision == stem for revision, stem in chain[2:])


def test_every_earlier_id_maps_to_the_same_migration_in_the_same_order() -> None:
    current = [revision for revision, _ in _chain()]
    # Listed in the order the migrations ran under their earlier ids, which is still the order;
    # migrations written after the renumbering never had another id.
    assert list(RENUMBERED.values()) == current[2 : 2 + len(RENUMBERED)]
    for earlier, now in RENUMBERED.items():
        assert earlier.split("_", 1)[1] == now.split("_", 1)[1]  # the same migration, renamed
    # No earlier id is a current one, so a stamp is never rewritten to the wrong migration.
    assert not set(RENUMBERED) & set(current)
    assert len(set(RENUMBERED.values())) == len(RENUMBERED)


def test_renumbered_leaves_current_ids_and_targets_alone() -> None:
    assert renumbered("0013_operations") == "0007_operations"
    assert renumbered("0026_retry_columns_contract") == "0016_retry_columns_contract"
    for revision in ("head", "base", "0001", "0002", "0013_forge_budgets", "head-1"):
        assert renumbered(revision) == revision
