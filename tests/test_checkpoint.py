"""TableStore.checkpoint: the localCheckpoint replacement that survives a lost executor (rows in Delta, in the
index's scratch area), and drop_scratch, which removes them after a successful run."""

from __future__ import annotations

import pytest

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
