"""Unity Catalog Volumes paths (``/Volumes/<catalog>/<schema>/<volume>/...``) as the index root, the
input and the staging folder: kept exactly as written (no resolving against the working directory,
no ``file:`` prefix), and the LLM stages' crash journal goes where ``storage.staging`` says."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphrag_spark.config import StorageConfig, load_config
from graphrag_spark.errors import UserError
from graphrag_spark.index.documents import file_format
from graphrag_spark.llm.coordinator import journal_dir
from graphrag_spark.tables import ENTITIES, TableStore

from conftest import REPO

VOLUME = "/Volumes/main/graphrag/files"


def test_a_volumes_root_names_its_tables_and_journal_as_written():
    storage = StorageConfig(root=f"{VOLUME}/index/")
    assert TableStore(None, storage).location(ENTITIES) == f"{VOLUME}/index/{ENTITIES}"
    assert journal_dir(storage.root) == Path(f"{VOLUME}/index/_llm_journal")


def test_volumes_input_files_are_read_by_their_extension():
    assert file_format(f"{VOLUME}/documents/2024/report.md", "auto") == "markdown"
    assert file_format(f"dbfs:{VOLUME}/documents/notes.txt", "auto") == "text"


def test_staging_holds_one_journal_folder_per_index_found_again_by_a_new_driver():
    staging = f"{VOLUME}/staging"
    cloud_root = "abfss://lake@account.dfs.core.windows.net/graphrag/index"
    first = journal_dir(cloud_root, staging)
    assert first.parent == Path(staging) and first == journal_dir(cloud_root, staging)
    assert journal_dir("abfss://lake@account.dfs.core.windows.net/other", staging) != first
    # Tables in a catalog: the schema names the index, so two schemas never share a journal.
    in_main = journal_dir(None, staging, index="main.graphrag")
    assert in_main.parent == Path(staging) and in_main != journal_dir(None, staging, index="main.graphrag_prod")
    # Without staging a cloud root's journal is in the driver's temp folder, again one per index.
    assert journal_dir(None, index="main.graphrag") != journal_dir(None, index="main.graphrag_prod")


def test_a_mapped_volume_receives_the_journal(tmp_path):
    """What a local test can do for a Volume: the same layout under a ``file:`` URI of a local folder."""
    mapped = tmp_path / VOLUME.lstrip("/") / "staging"
    journal = journal_dir("s3://bucket/index", f"file://{mapped}") / "extract.jsonl"
    journal.parent.mkdir(parents=True)
    journal.write_text('{"item_key": "k"}\n', encoding="utf-8")
    assert journal.is_relative_to(mapped) and journal.read_text(encoding="utf-8").startswith('{"item_key"')


def test_staging_must_be_a_folder_the_driver_can_write():
    cfg = load_config(REPO / "conf" / "local.yaml", [f"storage.staging={VOLUME}/staging"])
    assert cfg.storage.staging == f"{VOLUME}/staging"
    with pytest.raises(UserError, match="storage.staging must be a folder the driver can write"):
        load_config(REPO / "conf" / "local.yaml", ["storage.staging=s3://bucket/staging"])
