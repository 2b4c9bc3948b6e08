"""User mistakes end with one clear sentence (exit code 2), never a JVM stack trace; bad files are skipped and counted."""

from __future__ import annotations

import importlib.util

import pytest

from graphrag_spark import tables as T
from graphrag_spark.errors import UserError
from graphrag_spark.index.pipeline import run_index

from conftest import REPO

pytestmark = pytest.mark.spark


def _index_main():
    spec = importlib.util.spec_from_file_location("index_job", REPO / "jobs" / "index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_missing_input_path_exits_with_one_sentence(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _index_main()(["--config", str(REPO / "conf" / "local.yaml"), "--set", f"input.path={tmp_path / 'missing'}",
                       "--set", f"storage.root={tmp_path / 'index'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Input path") and "does not exist" in err and "\n" not in err


def test_empty_folder(spark, make_config, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="contains no files"):
        run_index(spark, make_config(input_path=tmp_path / "empty"))


def test_folder_of_only_unreadable_files_names_the_rejects_table(spark, make_config, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "empty.txt").write_bytes(b"")
    (folder / "blob.txt").write_bytes(b"\x00\x01\x02binary")
    (folder / "latin.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    with pytest.raises(UserError, match="No readable documents.*3 inputs were skipped.*input_rejects"):
        run_index(spark, make_config(input_path=folder))


def test_bad_files_are_skipped_and_counted_next_to_good_ones(spark, make_config, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "good.txt").write_text("Mayor Elena Voss visited Port Alder. Mayor Elena Voss met Port Alder workers.")
    (folder / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    (folder / "huge.txt").write_text("Port Alder " * 5000)
    (folder / "image.png").write_bytes(b"\x89PNG")
    cfg = make_config("input.max_document_bytes=20000", input_path=folder)
    summary = run_index(spark, cfg)
    assert summary.counts["documents"] == 1 and summary.counts["rejected inputs"] == 3
    reasons = {r.source.rsplit("/", 1)[-1]: r.reason for r in T.TableStore(spark, cfg.storage).read(T.INPUT_REJECTS).collect()}
    assert "not valid UTF-8" in reasons["latin.txt"]
    assert "above input.max_document_bytes" in reasons["huge.txt"]
    assert "unsupported file type" in reasons["image.png"]
