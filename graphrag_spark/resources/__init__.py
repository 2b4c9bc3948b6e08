"""Files the library needs at run time, shipped inside the wheel: prompts, the default configs and
the job scripts. In a source checkout these are links to the repository's ``prompts/``, ``conf/``
and ``jobs/``; an installed wheel holds copies."""

from pathlib import Path

RESOURCES = Path(__file__).resolve().parent
PROMPTS_DIR = RESOURCES / "prompts"
CONF_DIR = RESOURCES / "conf"
JOBS_DIR = RESOURCES / "jobs"
