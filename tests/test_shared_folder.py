"""Tests that read ../shared find it relative to the repository and fail, not skip, in CI when it is missing."""

import pytest

from conftest import REPO, SHARED, shared_path


def test_shared_folder_is_found_next_to_the_repository():
    assert SHARED == REPO.parent / "shared"


def test_a_missing_shared_file_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="shared folder must sit next to the repository"):
        shared_path("no/such/file.txt")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        shared_path("no/such/file.txt")
