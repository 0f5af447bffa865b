"""Reference tables generated from the code at build time, so the documentation cannot drift.

Directives (MyST: a fenced block ``{spectest-options}``):

* ``spectest-options``: every ``--spec-*`` option of the pytest plugin and the command line, from
  :data:`spectest.options.OPTIONS` and the plugin's flags;
* ``spectest-rules``: every rule and check name of :mod:`spectest.rules`, under its section;
* ``spectest-schema``: the results file's JSON Schema (``spectest.results/1``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from sphinx.application import Sphinx


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


class Generated(Directive):
    """Parse generated Markdown in place."""

    has_content = False

    def markdown(self) -> str:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        container = nodes.container()
        lines = self.markdown().splitlines()
        self.state.nested_parse(StringList(lines, source="generated"), self.content_offset, container)
        return container.children


class Options(Generated):
    def markdown(self) -> str:
        from spectest.options import OPTIONS

        rows = ["| option | ini key | meaning |", "| --- | --- | --- |"]
        for flag, ini, help_text, extra in OPTIONS:
            value = extra.get("metavar") or "/".join(extra.get("choices", []))
            repeat = " (repeatable)" if extra.get("action") == "append" else ""
            rows.append(f"| `{flag} {value}`{repeat} | `{ini}` | {_cell(help_text)} |")
        rows.append("| `--spec-no-shrink` | | report the first failing example without shrinking it |")
        rows.append(
            "| `--spec-e2e-speed` | | also run the end-to-end speed property on `--spec-engine` engines "
            "(timing: a quiet machine, minutes) |"
        )
        return "\n".join(rows)


class Rules(Generated):
    def markdown(self) -> str:
        import spectest.rules as module

        source = Path(module.__file__).read_text().splitlines()
        out: list[str] = []
        section = None
        for line in source:
            heading = re.match(r"^# (.+)$", line)
            if heading:
                section = heading.group(1)
                continue
            assignment = re.match(r"^([A-Z][A-Z0-9_]+) = \"(.+)\"$", line)
            if assignment:
                if section is not None:
                    out += [
                        "",
                        f"**{section}**",
                        "",
                        "| name | the rule or check, as failures name it |",
                        "| --- | --- |",
                    ]
                    section = None
                name, text = assignment.groups()
                out.append(f"| `rules.{name}` | {_cell(text)} |")
        return "\n".join(out)


class Schema(Generated):
    def markdown(self) -> str:
        from spectest.reporting.results import RESULTS_SCHEMA

        return "```json\n" + json.dumps(RESULTS_SCHEMA, indent=1) + "\n```"


def setup(app: Sphinx) -> dict:
    app.add_directive("spectest-options", Options)
    app.add_directive("spectest-rules", Rules)
    app.add_directive("spectest-schema", Schema)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
