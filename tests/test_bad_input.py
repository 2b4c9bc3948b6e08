"""User mistakes end with one clear sentence (exit code 2), never a JVM stack trace; bad files are skipped and counted."""

from __future__ import annotations

import importlib.util

import pytest

from graphrag_spark import tables as T
from graphrag_spark.config import InputConfig, SparkConfig
from graphrag_spark.errors import UserError
from graphrag_spark.index.documents import build_documents, check_local_input
from graphrag_spark.index.pipeline import run_index
from graphrag_spark.session import plain_paths_are_local

from conftest import REPO, SAMPLE_CORPUS

pytestmark = pytest.mark.spark


def _index_main():
    spec = importlib.util.spec_from_file_location("index_job", REPO / "jobs" / "index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_missing_input_path_exits_with_one_sentence_before_spark_starts(tmp_path, capsys, monkeypatch):
    import graphrag_spark.session

    def no_spark(*args, **kwargs):
        raise AssertionError("Spark was started for an input path that does not exist")

    monkeypatch.setattr(graphrag_spark.session, "build_spark", no_spark)
    with pytest.raises(SystemExit) as exit_info:
        _index_main()(["--config", str(REPO / "conf" / "local.yaml"), "--set", f"input.path={tmp_path / 'missing'}",
                       "--set", f"storage.root={tmp_path / 'index'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Input path") and "does not exist" in err and "\n" not in err


def test_only_paths_surely_on_this_machine_are_checked_before_spark(tmp_path, monkeypatch):
    missing = tmp_path / "missing"
    with pytest.raises(UserError, match="does not exist"):
        check_local_input(InputConfig(path=f"file://{missing}"), plain_paths_local=False)
    with pytest.raises(UserError, match="does not exist"):
        check_local_input(InputConfig(path=str(missing)), plain_paths_local=True)
    for left_to_spark, plain_paths_local in ((InputConfig(path=str(missing)), False),
                                             (InputConfig(path="hdfs:///corpus"), True),
                                             (InputConfig(path=f"{missing}/*.txt"), True),
                                             (InputConfig(path=str(missing), format="delta"), True)):
        check_local_input(left_to_spark, plain_paths_local)
    check_local_input(InputConfig(path=str(SAMPLE_CORPUS)), plain_paths_local=True)

    for name in ("PYSPARK_GATEWAY_PORT", "SPARK_REMOTE", "DATABRICKS_RUNTIME_VERSION", "HADOOP_CONF_DIR", "YARN_CONF_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert plain_paths_are_local(SparkConfig()) and plain_paths_are_local(SparkConfig(), "local[2]")
    assert not plain_paths_are_local(SparkConfig(), "yarn")
    assert not plain_paths_are_local(SparkConfig(master="sc://127.0.0.1:15002"))
    assert not plain_paths_are_local(SparkConfig(conf={"spark.hadoop.fs.defaultFS": "hdfs://nn:8020"}))
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    assert not plain_paths_are_local(SparkConfig())


def test_missing_or_empty_input_folder_in_the_spark_listing(spark, make_config, tmp_path):
    """Where the path is not checked before Spark (another file system), the listing gives the same sentences."""
    with pytest.raises(UserError, match="Input path .* does not exist"):
        build_documents(spark, InputConfig(path=str(tmp_path / "missing")))
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
    (folder / "empty.txt").write_bytes(b"")  # Spark's scan skips it: found from the listing
    (folder / "header.csv").write_text("text,title\n")
    cfg = make_config("input.max_document_bytes=20000", input_path=folder)
    summary = run_index(spark, cfg)
    assert summary.counts["documents"] == 1 and summary.counts["rejected inputs"] == 5
    reasons = {r.source.rsplit("/", 1)[-1]: r.reason for r in T.TableStore(spark, cfg.storage).read(T.INPUT_REJECTS).collect()}
    assert "not valid UTF-8" in reasons["latin.txt"]
    assert "above input.max_document_bytes" in reasons["huge.txt"]
    assert "unsupported file type" in reasons["image.png"]
    assert reasons["empty.txt"] == "empty file" and reasons["header.csv"] == "CSV has a header but no rows"


def _every_kind_of_input(folder):
    """A folder with every kind of document and reject the reader knows, under awkward file names."""
    text = "Mayor Elena Voss visited Port Alder. Mayor Elena Voss met Port Alder workers."
    (folder / "nested" / "deeper").mkdir(parents=True)
    (folder / "_skipped").mkdir()
    for name in ("good.txt", "copy of good.txt", "nested/deeper/good.txt", "h#1.txt", "x%41.txt"):
        (folder / name).write_text(text)
    (folder / "café notes.md").write_text("intro\n# Port Alder Shipyards\nThe shipyards reopened in March.")
    (folder / "bom.txt").write_bytes("\ufeffA text with a byte order mark.".encode())
    (folder / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    (folder / "huge.txt").write_text("Port Alder " * 5000)
    (folder / "image.png").write_bytes(b"\x89PNG")
    (folder / "empty.txt").write_bytes(b"")
    (folder / "empty.png").write_bytes(b"")
    (folder / "blank.txt").write_text("  \n\t\n")
    (folder / "blob.txt").write_bytes(b"\x00\x01\x02binary")
    (folder / "header.csv").write_text("text,title\n")
    (folder / "other columns.csv").write_text("body,title\nx,y\n")
    (folder / "rows.csv").write_text(f'text,title,lang\n"{text}",Visit,en\nThe harbour froze.,Winter,\n')
    (folder / "records.jsonl").write_text("\n".join([
        '{"text": "The harbour froze.", "title": "Winter", "tags": ["cold", "sea"], "year": 1902}', "{broken",
        "[1, 2]", '{"body": "no text field"}', '{"text": "   "}', ""]))
    (folder / ".hidden.txt").write_text("never listed")
    (folder / "_skipped" / "x.txt").write_text("never listed")
    (folder / "link.txt").symlink_to(folder / "good.txt")


def _rows(read):
    documents = sorted((r.id, r.title, r.text, r.source, tuple(r.duplicate_sources), tuple(sorted(r.metadata.items())),
                        r.n_chars) for r in read.documents.collect())
    return documents, sorted(map(tuple, read.rejects.collect())), read.counts


def test_a_small_local_folder_read_on_the_driver_gives_the_spark_reads_rows(spark, tmp_path, monkeypatch):
    """The driver-side read (``DRIVER_READ_BYTES``) runs no Spark job and gives the executors' read's rows, to
    the spelling of every source: a refresh that read the other way would otherwise see changed documents."""
    from graphrag_spark.index import documents as reader

    _every_kind_of_input(tmp_path)
    cfg = InputConfig(path=str(tmp_path), max_document_bytes=20000)
    spark.sparkContext.setJobGroup("driver-read", "the driver-side read")
    try:
        on_driver = reader.build_documents(spark, cfg)
        assert spark.sparkContext.statusTracker().getJobIdsForGroup("driver-read") == []
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    monkeypatch.setattr(reader, "DRIVER_READ_BYTES", 0)
    in_executors = reader.build_documents(spark, cfg)
    assert on_driver.rows is not None and in_executors.rows is None
    assert _rows(on_driver) == _rows(in_executors)
    documents, rejects, counts = _rows(on_driver)
    assert counts == {"documents": 4, "duplicates": 7, "rejected": 13, "chars": counts["chars"]} and counts["chars"] > 0
    assert sorted(on_driver.rows["id"]) == sorted(d[0] for d in documents)
    sources = {d[3].rsplit("/", 1)[-1] for d in documents} | {s.rsplit("/", 1)[-1] for d in documents for s in d[4]}
    assert {"h#1.txt", "x%41.txt", "copy of good.txt", "café notes.md", "link.txt"} <= sources
    assert {r[0].rsplit("/", 1)[-1]: r[1] for r in rejects}["empty.png"] == "empty file"
