"""TableStore's own materialisations: checkpoint, the localCheckpoint replacement that survives a lost executor
(rows in Delta, in the index's scratch area), and drop_scratch, which removes them after a successful run;
update_columns; writes in the background, which whatever touches their table waits for; appends that
create a table at once; and local_frame, the driver's rows as a frame with no Python job."""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timezone

import pytest
from pyspark.sql import Row
from pyspark.sql.types import ArrayType, MapType, StructType, TimestampType

from graphrag_spark import tables as T
from graphrag_spark.config import StorageConfig

pytestmark = pytest.mark.spark


def test_a_checkpoint_holds_its_rows_in_delta_and_is_dropped_after_the_run(spark, tmp_path):
    store = T.TableStore(spark, StorageConfig(root=str(tmp_path / "index")))
    spark.createDataFrame([(1, "a"), (2, "b")], "id long, text string").write.format("delta").save(str(tmp_path / "source"))
    source = spark.read.format("delta").load(str(tmp_path / "source"))

    kept = store.checkpoint(source.where("id > 0"), "stage_input")
    # The lineage is cut: changing the source afterwards does not change the checkpointed frame.
    spark.createDataFrame([(3, "c")], "id long, text string").write.format("delta").mode("overwrite").save(str(tmp_path / "source"))
    assert sorted(tuple(r) for r in kept.collect()) == [(1, "a"), (2, "b")]
    assert (tmp_path / "index" / T.SCRATCH / "stage_input" / "_delta_log").is_dir()

    # The same name again replaces the rows (a rerun after a crash starts from its own input).
    assert store.checkpoint(source, "stage_input").collect()[0].id == 3

    store.drop_scratch()
    assert not (tmp_path / "index" / T.SCRATCH).exists()
    store.drop_scratch()  # nothing left to drop: no error


def test_no_cached_plan_outlives_its_dropped_scratch_table(spark, tmp_path):
    """A frame over a published table and a scratch table still cached when the run drops its scratch
    (what Spark's CacheManager leaves when an unpersist races a write in another thread) is uncached with
    it: else the next MERGE into the published table re-plans it over the deleted path and fails with
    DELTA_SCHEMA_CHANGE_SINCE_ANALYSIS (seen in CI: test_llm_index's full rebuild, after the summaries)."""
    from pyspark import StorageLevel

    store = T.TableStore(spark, StorageConfig(root=str(tmp_path / "index")))
    store.write(spark.createDataFrame([("r1", "old")], "id string, description string"), "published")
    described = store.checkpoint(spark.createDataFrame([("r1", "s", "t", ["d"])],
                                                       "id string, source string, target string, descriptions array<string>"),
                                 "described_relationships")
    left_cached = store.read("published").join(described, "id").persist()
    assert left_cached.count() == 1

    store.drop_scratch()
    assert left_cached.storageLevel == StorageLevel.NONE
    spark.createDataFrame([("r1", "new")], "id string, description string").createOrReplaceTempView("merge_source")
    spark.sql(f"MERGE INTO {store.sql_name('published')} t USING merge_source s ON t.id = s.id "
              "WHEN MATCHED THEN UPDATE SET *")
    spark.catalog.dropTempView("merge_source")
    assert [tuple(r) for r in store.read("published").collect()] == [("r1", "new")]


def test_update_columns_sets_only_the_named_rows_and_columns(spark, tmp_path):
    store = T.TableStore(spark, StorageConfig(root=str(tmp_path / "index")))
    rows = [("a", 1, "A", "PERSON", [], "old a", ["u1"], 1, 2), ("b", 2, "B", "PLACE", [], "old b", [], 1, 1),
            ("c", 3, "C", "PERSON", [], "old c", [], 2, 1)]
    store.write(spark.createDataFrame(rows, T.SCHEMAS[T.ENTITIES]), T.ENTITIES)
    updates = spark.createDataFrame([("a", "new a"), ("c", None), ("z", "not in the table")], "id string, description string")

    store.update_columns(updates, T.ENTITIES, ["description"])

    after = {r.id: r for r in store.read(T.ENTITIES).collect()}
    assert sorted(after) == ["a", "b", "c"], "a key the table lacks adds no row"
    assert [after[i].description for i in "abc"] == ["new a", "old b", None]
    assert after["a"].text_unit_ids == ["u1"] and after["a"].degree == 2, "other columns are untouched"


def test_whatever_touches_a_table_written_in_the_background_waits_for_the_write_and_gets_its_error(spark, tmp_path):
    store = T.TableStore(spark, StorageConfig(root=str(tmp_path / "index")))
    rows = spark.createDataFrame([("d1", "a.txt")], "id string, source string")

    def slow_write():
        time.sleep(1.0)  # the checks below run while it sleeps
        store.write(rows, "notes", counted=False)  # the writing thread itself does not wait for its own write

    store.in_background("notes", slow_write)
    assert store.exists("notes") and store.read("notes").count() == 1

    def failing_write():
        time.sleep(0.5)
        raise OSError("disk full")

    store.in_background("other", failing_write)
    with pytest.raises(OSError, match="disk full"):
        store.read("other")
    with pytest.raises(OSError, match="disk full"):
        store.settle()


def test_a_failed_background_write_stops_the_run_publishes_nothing_and_frees_the_root(spark, make_config, tmp_path,
                                                                                      monkeypatch):
    from graphrag_spark.index import runs
    from graphrag_spark.index.pipeline import run_index

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "voss.txt").write_text("Mayor Elena Voss visited Port Alder. Mayor Elena Voss met the Port Alder dockers.")
    cfg = make_config(input_path=folder)
    write = T.TableStore.write

    def text_units_fail_in_the_background(self, df, name, *args, **kwargs):
        if name == T.TEXT_UNITS and threading.current_thread().name.startswith("write-behind"):
            raise OSError("disk full")
        return write(self, df, name, *args, **kwargs)

    monkeypatch.setattr(T.TableStore, "write", text_units_fail_in_the_background)
    with pytest.raises(OSError, match="disk full"):
        run_index(spark, cfg)
    store = T.TableStore(spark, cfg.storage)
    assert not store.exists(T.COMMUNITIES), "the run stops at the stage after the failure, not at its end"
    assert runs.published_run(store) is None
    assert [r.status for r in store.read(T.INDEX_RUNS).collect() if r.status != runs.RUNNING] == [runs.FAILED]
    assert runs.IndexLock(store, "probe", cfg.refresh).holder() is None, "the lock is released"


def test_two_appends_that_both_create_a_table_both_land(spark, tmp_path):
    """Two stages' first rows of a shared table (the embedding cache): both writers create it, Delta rejects the
    second commit (reproduced on every try here without the retry), and its rows are appended to the table."""
    store = T.TableStore(spark, StorageConfig(root=str(tmp_path / "index")))
    for trial in range(2):
        name, barrier, errors = f"shared_{trial}", threading.Barrier(2), []

        def append(n: int) -> None:
            rows = spark.createDataFrame([(n, "x")], "n long, s string")
            barrier.wait()
            try:
                store.write(rows, name, mode="append", counted=False)
            except Exception as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)

        threads = [threading.Thread(target=append, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors and sorted(r.n for r in store.read(name).collect()) == [0, 1]


def _sample(dtype):
    """A value of every kind a table holds, with what trips conversions: quotes, escapes, non-ASCII, nulls."""
    if isinstance(dtype, ArrayType):
        return [_sample(dtype.elementType), None]
    if isinstance(dtype, MapType):
        return {_sample(dtype.keyType): _sample(dtype.valueType)}
    if isinstance(dtype, StructType):
        return {field.name: _sample(field.dataType) for field in dtype.fields}
    if isinstance(dtype, TimestampType):
        return datetime(2026, 12, 5, 3, 4, 5, 123456, tzinfo=timezone.utc)
    return {"string": "é 'q' \"d\" \\ \n", "integer": 7, "long": 2**40 + 1, "double": 1.25, "float": 0.5,
            "boolean": True}[dtype.typeName()]


def test_local_frame_gives_create_data_frames_rows_with_no_python_job(spark):
    """Every table's schema, from tuples, dicts and Rows, with every value and with nulls: the same rows as
    ``createDataFrame`` of the list, converted by Arrow alone (no fallback), into a local relation (the list's
    frame is a Python RDD, whose job needs a Python worker). The driver's clock is off UTC, so a naive timestamp
    read as UTC rather than as local time shows."""
    stamps = T._schema(("naive", TimestampType()), ("aware", TimestampType()))
    spark.conf.set("spark.sql.execution.arrow.pyspark.fallback.enabled", "false")
    zone = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        shapes = {schema.simpleString(): (name, schema) for name, schema in [*T.SCHEMAS.items(), ("timestamps", stamps)]}
        for name, schema in shapes.values():
            full = tuple(_sample(field.dataType) for field in schema.fields)
            if name == "timestamps":
                full = (datetime(2026, 6, 1, 12, 30), datetime(2026, 1, 1, 23, 59, tzinfo=timezone.utc))
            rows = [full, (None,) * len(full), dict(zip(schema.fieldNames(), full)), Row(**dict(zip(schema.fieldNames(), full)))]
            frame = T.local_frame(spark, rows, schema)
            assert frame._jdf.queryExecution().optimizedPlan().getClass().getSimpleName() == "LocalRelation", name
            expected = spark.createDataFrame([full, rows[1], full, full], schema).collect()
            assert frame.schema == schema and frame.collect() == expected, name
        assert T.local_frame(spark, [], stamps).collect() == []
    finally:
        if zone is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = zone
        time.tzset()
        spark.conf.unset("spark.sql.execution.arrow.pyspark.fallback.enabled")
