"""GitLab's GraphQL query for many files at one ref, and how its answer is read (pure)."""

from __future__ import annotations

from bot.forges.blobs import MAX_FILE_BYTES
from bot.forges.gitlab_files import (
    BLOBS_QUERY,
    blob_text,
    blobs_answered,
    blobs_variables,
    graphql_url,
)


def test_the_endpoint_sits_beside_the_rest_api() -> None:
    assert graphql_url("https://gitlab.com") == "https://gitlab.com/api/graphql"
    assert graphql_url("https://git.example.com/") == "https://git.example.com/api/graphql"


def test_paths_and_ref_travel_as_variables_never_in_the_query_text() -> None:
    variables = blobs_variables("acme/platform/api", "abc123", ['we"ird {$x}.py', "b.py"])
    assert variables == {
        "project": "acme/platform/api",
        "ref": "abc123",
        "paths": ['we"ird {$x}.py', "b.py"],
    }
    assert "we" not in BLOBS_QUERY and "$paths" in BLOBS_QUERY and "$ref" in BLOBS_QUERY


def test_only_text_blobs_of_a_readable_size_give_text() -> None:
    node = {"path": "a.py", "oid": "o1", "size": "6", "rawTextBlob": "x = 1\n"}
    assert blob_text(node) == "x = 1\n"
    assert blob_text({**node, "rawTextBlob": None}) is None  # binary: GitLab gives no text
    assert blob_text({**node, "size": str(MAX_FILE_BYTES + 1)}) is None
    assert blob_text({**node, "size": MAX_FILE_BYTES + 1}) is None
    assert blob_text({**node, "rawTextBlob": "a\0b"}) is None
    assert blob_text(None) is None


def test_every_asked_path_is_answered_and_one_left_out_is_not_there() -> None:
    answer = {
        "data": {
            "project": {
                "repository": {
                    "blobs": {
                        "nodes": [
                            {"path": "b.py", "oid": "ob", "size": "1", "rawTextBlob": "b"},
                            {"path": "a.py", "oid": "oa", "size": "1", "rawTextBlob": "a"},
                        ]
                    }
                }
            }
        }
    }
    assert blobs_answered(["a.py", "gone.py", "b.py"], answer) == {
        "a.py": ("a", "oa"),
        "gone.py": (None, None),
        "b.py": ("b", "ob"),
    }


def test_a_project_gitlab_does_not_show_answers_none_for_every_path() -> None:
    assert blobs_answered(["a.py"], {"data": {"project": None}}) == {"a.py": (None, None)}


def test_errors_without_blobs_are_a_refusal() -> None:
    refused = {"errors": [{"message": "Field 'blobs' doesn't exist on type 'Repository'"}]}
    assert blobs_answered(["a.py"], refused) is None
    assert blobs_answered(["a.py"], {**refused, "data": None}) is None
    assert blobs_answered(["a.py"], "not json") is None
