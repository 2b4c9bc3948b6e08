"""A recording stand-in for what a Databricks notebook's globals hold: ``dbutils`` (widgets and secrets),
``display`` and ``displayHTML``. Those exist only on Databricks; the notebook tests run the same cells
with this stub to check that the notebooks ask the platform for their settings, keys and rendering."""

from __future__ import annotations


class _Widgets:
    def __init__(self, calls: list, values: dict[str, str]):
        self._calls, self._values = calls, values

    def text(self, name: str, default_value: str = "", label: str | None = None) -> None:
        self._calls.append(("widgets.text", name, default_value))
        self._values.setdefault(name, default_value)

    def get(self, name: str) -> str:
        self._calls.append(("widgets.get", name))
        if name not in self._values:
            raise ValueError(f"InputWidgetNotDefined: No input widget named {name} is defined")
        return self._values[name]


class _Secrets:
    def __init__(self, calls: list, secrets: dict[tuple[str, str], str]):
        self._calls, self._secrets = calls, secrets

    def get(self, scope: str, key: str) -> str:
        self._calls.append(("secrets.get", scope, key))
        if (scope, key) not in self._secrets:
            raise ValueError(f"Secret does not exist with scope: {scope} and key: {key}")
        return self._secrets[(scope, key)]


class StubDbutils:
    """``widget_values``: what the user typed into the widgets; ``secrets``: {(scope, key): value}."""

    def __init__(self, widget_values: dict[str, str] | None = None, secrets: dict[tuple[str, str], str] | None = None):
        self.calls: list[tuple] = []
        self.widgets = _Widgets(self.calls, dict(widget_values or {}))
        self.secrets = _Secrets(self.calls, dict(secrets or {}))


def databricks_globals(spark, dbutils: StubDbutils) -> dict:
    """A notebook namespace as Databricks prepares it; ``displayed`` and ``html`` record what was rendered."""
    displayed: list = []
    rendered: list[str] = []
    return {"spark": spark, "dbutils": dbutils, "display": displayed.append, "displayHTML": rendered.append,
            "displayed": displayed, "html": rendered, "__name__": "__notebook__"}
