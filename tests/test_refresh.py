"""Refresh: an index run on a root that already holds one works on what changed, publishes atomically,
keeps ids, numbers and unchanged communities, retracts deleted documents, and holds a lock.

Offline method (the properties here do not depend on what a model writes); the LLM-only properties
(claims, paid calls, a crash in the report stage) are in test_refresh_llm.py.
"""

from __future__ import annotations

import os
import shutil
import threading

import pytest
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import RefreshConfig
from graphrag_spark.index import runs
from graphrag_spark.index.pipeline import run_index
from graphrag_spark.index.refresh import same_rows
from graphrag_spark.query.api import GraphRagIndex

from conftest import SAMPLE_CORPUS, table_rows

pytestmark = pytest.mark.spark

CORPUS_A = ("lumen_cells_factory.txt", "harbour_expansion.md", "election.jsonl")
# Document B reaches one region of A's graph only (Gregor Lind, with names A never mentions): a
# sample document would not do, since each mentions a name A holds once, and that name, now seen
# twice, becomes an entity with co-occurrence edges all over A. B spans two text units (an entity
# needs two), its names in both; the filler between them holds no phrase.
B_NAME, B_SNIPPET = "rowing_club.md", "Kestrel Rowing Club elected Gregor Lind"
B_TEXT = ("# Kestrel Rowing Club\n\nThe Kestrel Rowing Club elected Gregor Lind as its captain. Jonas Ferreira coaches "
          "the crew for the Marrow Cup.\n\n"
          + " ".join(["rowing was hard work for everyone on cold mornings and long evenings"] * 50)
          + "\n\nGregor Lind said the Kestrel Rowing Club would race for the Marrow Cup. Jonas Ferreira thanked him.")


def _copy(folder, names):
    folder.mkdir(exist_ok=True)
    for name in names:
        shutil.copy(SAMPLE_CORPUS / name, folder / name)


def _published(spark, cfg):
    return runs.published_store(spark, cfg.storage)


def _ari(a: dict, b: dict) -> float:
    from sklearn.metrics import adjusted_rand_score

    common = sorted(set(a) & set(b))
    return adjusted_rand_score([a[k] for k in common], [b[k] for k in common])


def _membership(store, level):
    rows = store.read(T.COMMUNITIES).where(F.col("level") == level).select("community", F.explode("entity_ids").alias("e"))
    return {r.e: r.community for r in rows.collect()}


def test_two_jobs_racing_for_a_root_one_wins_the_other_is_told_who(spark, tmp_path, monkeypatch):
    from graphrag_spark.config import StorageConfig

    store = T.TableStore(spark, StorageConfig(root=str(tmp_path / "index")))
    cfg = RefreshConfig(lock_heartbeat_s=60)

    def race(round_):
        barrier, outcomes = threading.Barrier(2), {}

        def take(run_id):
            lock = runs.IndexLock(store, run_id, cfg, job=f"job {run_id}")
            barrier.wait()
            try:
                lock.acquire()
                outcomes[run_id] = lock
            except runs.RootLocked as exc:
                outcomes[run_id] = str(exc)

        threads = [threading.Thread(target=take, args=(f"run-{round_}-{i}",)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [k for k, v in outcomes.items() if isinstance(v, runs.IndexLock)]
        assert len(winners) == 1, outcomes
        loser = next(v for v in outcomes.values() if isinstance(v, str))
        assert winners[0] in loser and f"job {winners[0]}" in loser and loser.startswith("Another index job is running")
        outcomes[winners[0]].release()

    race(0)  # a new root: both create the lock table, one commit wins
    race(1)  # a free lock: both swap it from free, one commit wins
    # A free lock is taken with one commit, no read of its holder first.
    holder_reads = []
    original = runs.IndexLock.holder
    monkeypatch.setattr(runs.IndexLock, "holder", lambda self: holder_reads.append(1) or original(self))
    again = runs.IndexLock(store, "run-2", cfg)
    again.acquire()
    again.release()
    assert holder_reads == []
    assert store.read(T.INDEX_LOCK).where(F.col("run_id").isNotNull()).count() == 0


def test_a_full_build_reads_its_files_while_it_takes_the_lock_and_leaves_no_read_behind(spark, make_config, monkeypatch):
    from graphrag_spark.index import pipeline

    class Stopped(Exception):
        pass

    reading, read, seen = threading.Event(), threading.Event(), {}
    original = pipeline.build_documents

    def build_documents(*args):
        reading.set()
        try:
            return original(*args)
        finally:
            read.set()

    monkeypatch.setattr(pipeline, "build_documents", build_documents)

    def acquire(lock):
        seen["reading"] = reading.wait(30)
        raise Stopped

    monkeypatch.setattr(runs.IndexLock, "acquire", acquire)
    with pytest.raises(Stopped):
        run_index(spark, make_config())
    assert seen["reading"], "the input is read before the lock is taken, not after"
    assert read.is_set(), "a run that ends early leaves no read running behind it"


def test_refresh_adds_and_deletes_documents_like_a_full_build_and_keeps_numbers(spark, make_config, tmp_path):
    folder = tmp_path / "docs"
    _copy(folder, CORPUS_A)
    cfg = make_config("refresh.cache_retention_days=0", input_path=folder)
    first = run_index(spark, cfg)
    assert first.mode == "full"
    before = _published(spark, cfg)
    old_entities = {r.id: r.human_readable_id for r in before.read(T.ENTITIES).collect()}
    old_reports = {r.community: r.full_content for r in before.read(T.COMMUNITY_REPORTS).collect()}
    old_communities = {r.id: r for r in before.read(T.COMMUNITIES).collect()}
    n_documents_a = before.read(T.DOCUMENTS).count()  # election.jsonl holds several documents

    (folder / B_NAME).write_text(B_TEXT, encoding="utf-8")
    refresh = run_index(spark, cfg)
    assert refresh.mode == "refresh"
    assert refresh.counts["documents new"] == 1 and refresh.counts["documents unchanged"] == n_documents_a
    assert refresh.counts["documents changed"] == 0 and refresh.counts["documents deleted"] == 0
    after = _published(spark, cfg)

    reference_cfg = make_config(f"storage.root={tmp_path / 'reference'}", "refresh.vacuum_retain_hours=null",
                                input_path=folder)
    run_index(spark, reference_cfg)
    reference = _published(spark, reference_cfg)
    tables = {T.DOCUMENTS: ["id", "title", "text", "source"],
              T.TEXT_UNITS: ["id", "document_id", "chunk_index", "text", "n_tokens"],
              T.ENTITIES: ["id", "title", "type", "description", "text_unit_ids", "frequency", "degree"],
              T.RELATIONSHIPS: ["id", "source", "target", "weight", "description", "text_unit_ids", "combined_degree"],
              T.CLAIMS: ["id", "text_unit_id", "subject", "description"]}
    for name, columns in tables.items():
        assert table_rows(after, name, columns) == table_rows(reference, name, columns), \
            f"{name} differs from a full build"

    # Numbers are assigned once: every old entity keeps its number, new ones come after the largest.
    new_numbers = {r.id: r.human_readable_id for r in after.read(T.ENTITIES).collect()}
    assert all(new_numbers[i] == n for i, n in old_entities.items() if i in new_numbers)
    assert min(n for i, n in new_numbers.items() if i not in old_entities) > max(old_entities.values())
    assert len(set(new_numbers.values())) == len(new_numbers)

    levels = sorted({r.level for r in after.read(T.COMMUNITIES).select("level").distinct().collect()})
    ari = {level: round(_ari(_membership(after, level), _membership(reference, level)), 3) for level in levels}
    print(f"adjusted Rand index per level, refresh vs full build: {ari}")

    # Every community B did not reach is found again with its id and number and, its elements
    # unchanged, its report; the one B reached has new members, so a new id and a new number.
    entities = {r.id: (r.description, r.degree) for r in after.read(T.ENTITIES).collect()}
    old_entity_rows = {r.id: (r.description, r.degree) for r in before.read(T.ENTITIES).collect()}
    lind = before.read(T.ENTITIES).where(F.col("title") == "GREGOR LIND").collect()[0].id
    reached = {i for i, old in old_communities.items() if lind in old.entity_ids}
    reports = {r.community: r.full_content for r in after.read(T.COMMUNITY_REPORTS).collect()}
    found = {r.id: r for r in after.read(T.COMMUNITIES).collect()}
    assert reached and set(old_communities) - reached, "B reaches part of A's communities"
    for community_id, old in old_communities.items():
        if community_id in reached:
            assert community_id not in found
            continue
        row = found[community_id]
        assert row.community == old.community
        assert list(row.relationship_ids) == list(old.relationship_ids)
        assert all(entities[e] == old_entity_rows[e] for e in row.entity_ids)
        assert reports[row.community] == old_reports[old.community]
    assert refresh.counts["communities kept"] == f"{len(old_communities) - len(reached)} of {len(found)}"

    lock_version = T.TableStore(spark, cfg.storage).version(T.INDEX_LOCK)
    nothing = run_index(spark, cfg)
    assert nothing.counts["nothing changed"] and nothing.counts["documents unchanged"] == n_documents_a + 1
    # Read before the lock and found unchanged: no lock taken, no run recorded.
    assert T.TableStore(spark, cfg.storage).version(T.INDEX_LOCK) == lock_version
    assert nothing.run_id not in {r.run_id for r in GraphRagIndex.load(spark, cfg).runs().collect()}
    assert sum(nothing.seconds.get(stage, 0) for stage in ("graph", "communities", "community_reports")) == 0
    assert _published(spark, cfg).versions[T.ENTITIES] == after.versions[T.ENTITIES]
    # The same documents again: not even the documents table is rewritten.
    assert _published(spark, cfg).versions[T.DOCUMENTS] == after.versions[T.DOCUMENTS]

    # Deletion: nothing published refers to the document, its text units, or what only it supported.
    deleted = after.read(T.DOCUMENTS).where(F.col("source").endswith(B_NAME)).collect()[0]
    units = [r.id for r in after.read(T.TEXT_UNITS).where(F.col("document_id") == deleted.id).collect()]
    only_there = [r.id for r in after.read(T.ENTITIES).collect() if set(r.text_unit_ids) <= set(units)]
    assert units and only_there
    (folder / B_NAME).unlink()
    summary = run_index(spark, cfg)
    assert summary.counts["documents deleted"] == 1 and summary.counts["documents unchanged"] == n_documents_a
    gone = _published(spark, cfg)
    assert B_SNIPPET in deleted.text
    for name in T.PUBLISHED:
        if gone.exists(name):
            text = _texts(gone, name)
            for needle in [deleted.id, *units, *only_there, B_SNIPPET]:
                assert needle not in text, f"{name} still holds {needle!r} of the deleted document"
    # Back to corpus A: the same graph as the first run, with the first run's numbers.
    assert table_rows(gone, T.ENTITIES, tables[T.ENTITIES]) == table_rows(before, T.ENTITIES, tables[T.ENTITIES])
    assert {r.id: r.human_readable_id for r in gone.read(T.ENTITIES).collect()} == old_entities

    # Every recorded run can still be opened as it was published (until VACUUM retention).
    old = GraphRagIndex.load(spark, cfg, run_id=refresh.run_id)
    assert old.table(T.DOCUMENTS).where(F.col("id") == deleted.id).count() == 1
    assert GraphRagIndex.load(spark, cfg).table(T.DOCUMENTS).where(F.col("id") == deleted.id).count() == 0
    modes = [r.mode for r in GraphRagIndex.load(spark, cfg).runs().where(F.col("status") == "succeeded").collect()]
    assert sorted(modes) == ["full", "refresh", "refresh"]  # the run that found nothing changed records none


def _texts(store, name):
    """Every value of a table as one text to search (arrays and maps included)."""
    frame = store.read(name)
    return " ".join(r[0] for r in frame.select(F.to_json(F.struct(*frame.columns))).collect())


def test_change_data_feed_reads_only_changed_rows_and_records_the_version(spark, make_config, tmp_path):
    source = str(tmp_path / "source")
    texts = {i: (SAMPLE_CORPUS / name).read_text(encoding="utf-8") for i, name in
             enumerate(["lumen_cells_factory.txt", "harbour_expansion.md", "seals_report.md"])}
    (spark.createDataFrame([(i, f"doc {i}", t) for i, t in texts.items()], "doc_id int, title string, text string")
     .write.format("delta").option("delta.enableChangeDataFeed", "true").save(source))
    cfg = make_config("input.format=delta", "input.id_column=doc_id", "input.change_data_feed=true",
                      "refresh.vacuum_retain_hours=null", input_path=source)
    run_index(spark, cfg)
    spark.sql(f"UPDATE delta.`{source}` SET text = concat(text, '\\n\\nA late addendum on the harbour.') WHERE doc_id = 1")
    spark.sql(f"DELETE FROM delta.`{source}` WHERE doc_id = 2")
    spark.createDataFrame([(3, "doc 3", (SAMPLE_CORPUS / "election.jsonl").read_text(encoding="utf-8"))],
                          "doc_id int, title string, text string").write.format("delta").mode("append").save(source)
    refresh = run_index(spark, cfg)
    assert {k: refresh.counts[f"documents {k}"] for k in ("new", "changed", "deleted", "unchanged")} == \
        {"new": 1, "changed": 1, "deleted": 1, "unchanged": 1}
    store = _published(spark, cfg)
    expected = {(f"{source}#{r.doc_id}", r.title) for r in spark.read.format("delta").load(source).collect()}
    assert {(r.source, r.title) for r in store.read(T.DOCUMENTS).collect()} == expected
    latest = spark.sql(f"DESCRIBE HISTORY delta.`{source}` LIMIT 1").collect()[0]["version"]
    assert runs.published_run(T.TableStore(spark, cfg.storage))["source_version"] == latest


def test_lock_sql_strings_survive_quotes_and_backslashes(spark):
    value = "it's a \\ job's name"
    assert spark.sql(f"SELECT {runs._sql_string(value)} AS v").collect()[0].v == value


def test_a_relative_root_is_resolved_as_spark_would_and_its_lock_works_in_sql(spark, tmp_path):
    """The quickstart's root is relative (output/index), and Delta takes ``delta.`<path>``` in SQL (the lock's
    UPDATE) only for an absolute path: a relative one failed as an unsupported "direct query on files"."""
    from graphrag_spark.config import InputConfig, StorageConfig
    from graphrag_spark.index import documents

    jvm_working_dir = spark.sparkContext._jvm.java.lang.System.getProperty("user.dir")
    relative = os.path.relpath(tmp_path / "index", jvm_working_dir)
    store = T.TableStore(spark, StorageConfig(root=relative))
    assert store.location(T.DOCUMENTS) == f"{tmp_path}/index/{T.DOCUMENTS}"
    # The same for a Delta table input (its version read with DESCRIBE HISTORY).
    assert documents._table_name(spark, InputConfig(path=relative, format="delta")) == f"delta.`{tmp_path}/index`"
    probe = lambda: runs.IndexLock(store, "probe", RefreshConfig()).holder()  # noqa: E731
    for run_id in ("first", "second"):  # the first creates the lock's table, the second takes it with an UPDATE
        with runs.IndexLock(store, run_id, RefreshConfig()):
            assert probe()["run_id"] == run_id
        assert probe() is None
    for written in ("s3a://bucket/index", "/already/absolute"):
        assert T.TableStore(spark, StorageConfig(root=written)).storage.root == written


def test_vacuum_deletes_files_only_old_versions_use_and_restores_the_listing_width(spark, tmp_path):
    from graphrag_spark.config import StorageConfig
    from graphrag_spark.index import retention

    store = T.TableStore(spark, StorageConfig(root=str(tmp_path / "index")))
    for text in ("a deleted document's text", "what is left"):
        spark.createDataFrame([(text,)], "text string").coalesce(1).write.format("delta").mode("overwrite").save(store.location(T.DOCUMENTS))
    files = lambda: {p.name for p in (tmp_path / "index").rglob("*.parquet") if "_delta_log" not in p.parts}  # noqa: E731
    assert len(files()) == 2
    listing = spark.conf.get(retention._LISTING_PARALLELISM)
    retention.vacuum(store, 0)
    assert len(files()) == 1 and [r.text for r in store.read(T.DOCUMENTS).collect()] == ["what is left"]
    assert spark.conf.get(retention._LISTING_PARALLELISM) == listing


def test_same_rows_sees_any_changed_value_or_multiplicity(spark):
    schema = "id string, metadata map<string,string>, n long"
    rows = [("a", {"k": "1"}, 1), ("b", None, 2)]
    published = spark.createDataFrame(rows, schema)
    columns = ["id", "metadata", "n"]
    assert same_rows([(spark.createDataFrame(rows[::-1], schema), published, columns)])
    for other in ([("a", {"k": "2"}, 1), rows[1]], [rows[0], ("b", None, 3)], rows + [rows[1]], rows[:1]):
        assert not same_rows([(spark.createDataFrame(other, schema), published, columns)]), other
    # Pairs are told apart: the same rows under another pair do not balance out.
    assert not same_rows([(published, published.limit(1), columns), (published.limit(1), published, columns)])
