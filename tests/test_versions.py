"""The import-time check of a cluster's numpy, pandas and pyarrow (graphrag_spark/versions.py): the Databricks LTS
runtimes' own versions pass, an unsupported one is one sentence that names it, and the bounds are pyproject.toml's."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest

from conftest import REPO
from graphrag_spark.versions import SUPPORTED, conflict, release

# Their release notes' "Installed Python libraries" (README, Install: which runtimes were checked and how).
DBR_15_4 = {"numpy": "1.23.5", "pandas": "1.5.3", "pyarrow": "14.0.1"}
DBR_16_4 = {"numpy": "1.26.4", "pandas": "1.5.3", "pyarrow": "15.0.2"}


def test_release_reads_the_numeric_part():
    assert release("1.26.4") == (1, 26, 4) and release("2.0.0rc1") == (2, 0, 0) and release("1.24") == (1, 24)
    assert release("1.23.5") < release("1.24") and release("3.0.0") >= release("3")


@pytest.mark.parametrize("runtime", [DBR_15_4, DBR_16_4, {"numpy": "2.1.3", "pandas": "2.2.3", "pyarrow": "19.0.1"}])
def test_the_lts_runtimes_own_libraries_pass(runtime):
    assert conflict(runtime) is None


@pytest.mark.parametrize("name, have, needed", [("numpy", "1.22.4", "numpy>=1.23.5"), ("pandas", "1.4.4", "pandas>=1.5.3"),
                                                ("pyarrow", "12.0.1", "pyarrow>=14.0.1"), ("numpy", "3.0.0", "numpy<3")])
def test_an_unsupported_version_is_one_sentence_naming_it(name, have, needed):
    message = conflict({**DBR_16_4, name: have})
    assert needed in message and f"{name} {have}" in message and message.count(". ") == 0


def test_pandas_1_under_numpy_2_is_named():
    message = conflict({**DBR_15_4, "numpy": "2.1.3"})
    assert "pandas 1.5.3" in message and "numpy 2.1.3" in message
    assert conflict({"numpy": "2.1.3", "pandas": "2.2.2", "pyarrow": "19.0.1"}) is None


def test_a_library_pip_has_not_installed_is_left_to_its_own_import_error():
    assert conflict({"numpy": None, "pandas": "1.5.3", "pyarrow": None}) is None


def test_the_bounds_are_pyprojects():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for name, (lowest, first_unsupported) in SUPPORTED.items():
        spec = f"{name}>={lowest}" + (f",<{first_unsupported}" if first_unsupported else "")
        assert spec in dependencies, (spec, [d for d in dependencies if d.startswith(name)])


def test_importing_the_package_under_an_unsupported_numpy_fails_with_that_sentence(tmp_path):
    # Package metadata found first on sys.path says numpy 1.22.4 (as a runtime library loaded ahead of pip's would).
    fake = tmp_path / "numpy-1.22.4.dist-info"
    fake.mkdir()
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 1.22.4\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    proc = subprocess.run([sys.executable, "-c", "import graphrag_spark"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "ImportError: " + conflict({**DBR_16_4, "numpy": "1.22.4"})
