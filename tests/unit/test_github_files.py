"""The GraphQL query that reads many files at one commit, and how its answer is read (pure)."""

from __future__ import annotations

import re

from bot.forges.blobs import MAX_FILE_BYTES
from bot.forges.github_files import (
    blob_text,
    files_answered,
    files_query,
    files_variables,
    graphql_url,
)


def test_the_endpoint_sits_beside_the_rest_api_on_github_and_enterprise_server() -> None:
    assert graphql_url("https://api.github.com") == "https://api.github.com/graphql"
    assert graphql_url("https://api.github.com/") == "https://api.github.com/graphql"
    assert graphql_url("https://ghe.example.com/api/v3") == "https://ghe.example.com/api/graphql"
    assert graphql_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080/graphql"


def test_each_file_is_one_aliased_lookup_whose_expression_is_a_variable() -> None:
    query = files_query(3)
    assert re.findall(r"(f\d+): object\(expression: \$(e\d+)\)", query) == [
        ("f0", "e0"),
        ("f1", "e1"),
        ("f2", "e2"),
    ]
    assert "$e2: String!" in query and "$e3" not in query
    # A path with quotes, braces or "$" travels in the variables, never in the query text.
    variables = files_variables("acme", "shop", "abc", ['we"ird {$x}.py', "b.py"])
    assert variables == {
        "owner": "acme",
        "name": "shop",
        "e0": 'abc:we"ird {$x}.py',
        "e1": "abc:b.py",
    }


def test_only_text_blobs_of_a_readable_size_give_text() -> None:
    blob = {"text": "x = 1\n", "isBinary": False, "isTruncated": False, "byteSize": 6, "oid": "a1"}
    assert blob_text(blob) == "x = 1\n"
    assert blob_text({**blob, "isBinary": True}) is None
    assert blob_text({**blob, "isTruncated": True}) is None
    assert blob_text({**blob, "text": None}) is None
    assert blob_text({**blob, "byteSize": MAX_FILE_BYTES + 1}) is None
    assert blob_text({**blob, "text": "a\0b"}) is None
    assert blob_text(None) is None  # not at that commit
    assert blob_text({}) is None  # a tree or a submodule: not a Blob, no fields


def test_every_asked_path_is_answered_in_order_with_its_blob_id() -> None:
    repository = {
        "f0": {"text": "a", "isBinary": False, "isTruncated": False, "byteSize": 1, "oid": "o0"},
        "f1": None,
    }
    assert files_answered(["a.py", "gone.py", "missing.py"], repository) == {
        "a.py": ("a", "o0"),
        "gone.py": (None, None),
        "missing.py": (None, None),
    }
    assert files_answered(["a.py"], None) == {"a.py": (None, None)}
