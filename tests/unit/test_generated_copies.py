# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The literal copies of the option and result tables: scripts/generate.py and what it wrote.

The check (`make lint` runs ``generate.py --check``) must fail on a hand-edited copy of every
generated block, leave hand-written text alone, and adding one option row must reach every
copy. The copies themselves must say what the engine does: the three drifts they once had
(backup_interval_days described backwards by the role, vacuum_switch_incremental not settable
from the role or maintain.yml, allow_foreign_owner described differently) each have a test.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "generate.py"
TABLES = ["plugins/module_utils/_hermes/options.py", "plugins/module_utils/_hermes/results.py", "tests/matrix.yml"]
# generate.py also checks that each admitted core has its sanity ignore file.
TABLES += sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "sanity").glob("ignore-*.txt"))
PREFIX = "hermes_maintenance_"


def load_script():
    spec = importlib.util.spec_from_file_location("hermes_generate_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATE = load_script()
OPTIONS, RESULTS = GENERATE.load_tables(str(REPO))
BLOCKS = sorted(GENERATE.blocks(OPTIONS, RESULTS))
ROLE_OPTIONS = [o.name for o in OPTIONS.OPTIONS if o.role == OPTIONS.ROLE_GENERATED]


def run_generate(root, *args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), *args], capture_output=True, text=True, check=False
    )


def copy_tree(tmp_path):
    """The files the script reads and writes, copied into tmp_path."""
    matrix_copies = {path for path, _name in GENERATE.matrix_blocks(GENERATE.load_matrix(str(REPO)))}
    for path in {path for path, _name in BLOCKS} | matrix_copies | set(TABLES):
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / path, target)
    return tmp_path


def edit_inside(path, block):
    """Change the first line inside ``block`` of ``path``, as a hand edit would."""
    lines = path.read_text().splitlines(True)
    begin = next(i for i, line in enumerate(lines) if re.search(r"BEGIN GENERATED: %s\b" % re.escape(block), line))
    lines[begin + 1] = lines[begin + 1].rstrip("\n") + " hand-edited\n"
    path.write_text("".join(lines))


def test_the_tree_matches_its_tables():
    proc = run_generate(REPO, "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path, block", BLOCKS, ids=["%s:%s" % b for b in BLOCKS])
def test_check_fails_on_a_hand_edited_block(tmp_path, path, block):
    root = copy_tree(tmp_path)
    assert run_generate(root, "--check").returncode == 0
    edit_inside(root / path, block)
    proc = run_generate(root, "--check")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert path in proc.stderr and "hand-edited" in proc.stdout  # names the file, shows the diff
    assert run_generate(root).returncode == 0  # the script puts the block back
    assert (root / path).read_text() == (REPO / path).read_text()


def test_hand_written_text_outside_the_blocks_is_kept(tmp_path):
    root = copy_tree(tmp_path)
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("# hermes_agent.ops", "# hermes_agent.ops (edited by hand)", 1))
    assert run_generate(root, "--check").returncode == 0
    assert run_generate(root).returncode == 0
    assert "(edited by hand)" in readme.read_text()


def test_a_missing_end_marker_is_an_error_not_a_rewrite(tmp_path):
    root = copy_tree(tmp_path)
    defaults = root / "roles/session_maintenance/defaults/main.yml"
    before = defaults.read_text().replace("# END GENERATED\n", "")
    defaults.write_text(before)
    proc = run_generate(root)
    assert proc.returncode == 2 and "END GENERATED" in proc.stderr
    assert defaults.read_text() == before


def test_one_new_option_row_reaches_every_copy(tmp_path):
    root = copy_tree(tmp_path)
    table = root / TABLES[0]
    row = 'Option("sample_limit", "int", default=7, minimum=1, doc=("A sample option for the test.",)),\n'
    text = table.read_text()
    table.write_text(text.replace("\nBY_NAME = ", "\nOPTIONS = OPTIONS + (%s)\nBY_NAME = " % row, 1))
    assert run_generate(root, "--check").returncode == 1
    assert run_generate(root).returncode == 0
    for path, _block in BLOCKS:
        if path in ("plugins/doc_fragments/hermes.py", "plugins/doc_fragments/pacing.py"):
            continue  # shared options only / busy_timeout and batch_pause only
        if "results" in _block or _block == "return":
            continue
        if _block == "deletes":
            continue  # the README's few options whose defaults delete data
        assert "sample_limit" in (root / path).read_text(), path
    assert "sample_limit" not in (root / "plugins/doc_fragments/hermes.py").read_text()


# ---- what the copies say -------------------------------------------------------------------


def module_docs():
    """session_maintenance's options as ansible-doc merges them (its own + the doc fragments)."""
    namespace = {}
    source = (REPO / "plugins/modules/session_maintenance.py").read_text()
    exec(compile(source.split("from ansible.module_utils", 1)[0], "session_maintenance", "exec"), namespace)
    options = {}
    for name, parts in (("hermes", ("DOCUMENTATION",)), ("pacing", ("DOCUMENTATION", "BATCH_PAUSE"))):
        fragment = {}
        exec((REPO / "plugins/doc_fragments" / (name + ".py")).read_text(), fragment)
        for part in parts:
            options.update(yaml.safe_load(getattr(fragment["ModuleDocFragment"], part))["options"])
    options.update(yaml.safe_load(namespace["DOCUMENTATION"])["options"])
    return options


def role_specs():
    specs = yaml.safe_load((REPO / "roles/session_maintenance/meta/argument_specs.yml").read_text())
    return specs["argument_specs"]["main"]["options"]


def role_wording(text):
    """The module's wording as the role's docs put it: O(x) is the role variable of x."""
    return re.sub(r"O\((\w+)\)", lambda m: "O(%s%s)" % (PREFIX, m.group(1)), text)


def test_role_and_module_describe_backup_interval_days_alike():
    role = role_specs()[PREFIX + "backup_interval_days"]["description"]
    module = module_docs()["backup_interval_days"]["description"]
    assert "older than" in role[0] and "Skip the backup" not in " ".join(role)
    assert role[: len(module)] == module


def test_role_and_module_describe_allow_foreign_owner_alike():
    role = role_specs()[PREFIX + "allow_foreign_owner"]["description"]
    assert role[:-1] == module_docs()["allow_foreign_owner"]["description"]


def test_role_describes_every_engine_option_as_the_module_does():
    module, role = module_docs(), role_specs()
    for name in ROLE_OPTIONS:
        spec = role[PREFIX + name]
        assert spec["type"] == module[name]["type"], name
        assert spec["description"][:-1] == [role_wording(p) for p in module[name]["description"]], name
        assert spec["description"][-1].startswith(("Unset (null, the default)", "Default: the engine's default")), name


def test_vacuum_switch_incremental_is_settable_from_role_and_maintain_playbook():
    defaults = yaml.safe_load((REPO / "roles/session_maintenance/defaults/main.yml").read_text())
    play = yaml.safe_load((REPO / "playbooks/maintain.yml").read_text())[0]
    template = (REPO / "roles/session_maintenance/templates/maintenance.json.j2").read_text()
    names = play["vars"]["hermes_ops_option_names"]
    module_args = [
        task["hermes_agent.ops.session_maintenance"]
        for block in play["tasks"]
        for task in block.get("block", [block])
        if "hermes_agent.ops.session_maintenance" in task
    ]
    assert len(module_args) == 2  # the service window and the plain run
    for name in ROLE_OPTIONS:
        assert PREFIX + name in defaults, name
        assert defaults[PREFIX + name] in (None, OPTIONS.BY_NAME[name].default), name
        assert PREFIX + name in role_specs(), name
        assert name in names, name
        assert all(name in args for args in module_args), name
        assert "'%s'" % name in template, name
    assert "vacuum_switch_incremental" in ROLE_OPTIONS


def test_state_db_info_documents_every_key_of_a_profile(tmp_path):
    """Its RETURN was once written by hand and missed keys the engine returns (home,
    page_count, auto_vacuum, mode); now it is generated from the table this compares with."""
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.info import gather_info
    from hermes_fixtures import build_home, standard_scenario

    build_home(str(tmp_path), "v30", standard_scenario("v30")[0])
    (profile,) = gather_info({"hermes_home": [str(tmp_path)]})["profiles"]
    assert profile["status"] == "ok", profile["error"]
    assert sorted(profile) == sorted(field.module_key for field in RESULTS.INFO_PROFILE_FIELDS)


# Records of measured runs (they name the settings each run used), not copies of a default.
RECORDS = ("docs/benchmarks.md",)


def hand_written_lines(text):
    """The lines of ``text`` outside its generated blocks."""
    inside = False
    for line in text.splitlines():
        if GENERATE.BEGIN.search(line) or GENERATE.END.search(line):
            inside = not inside and bool(GENERATE.BEGIN.search(line))
            continue
        if not inside:
            yield line


def product_files():
    """The collection's own files, as paths relative to REPO (a walk: ansible-test units runs
    on a copy that is no git checkout); not the tests, changelogs, bench, caches or builds."""
    skip = {"tests", "changelogs", "bench", "build", "node_modules", "__pycache__"}
    for top, dirs, files in os.walk(str(REPO)):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in skip]
        for name in files:
            path = os.path.relpath(os.path.join(top, name), str(REPO))
            if path not in RECORDS:
                yield path


def default_spellings(value):
    spellings = {repr(value), str(value)}
    if isinstance(value, bool):
        spellings |= {str(value).lower()}
    if isinstance(value, float) and value == int(value):
        spellings |= {str(int(value))}
    return spellings


@pytest.mark.parametrize(
    "option", [o for o in OPTIONS.OPTIONS if o.default is not None and not isinstance(o.default, list)], ids=str
)
def test_each_default_is_written_once_outside_the_generated_blocks(option):
    """``name: default``, ``name=default`` or ``"name": default`` in the product's files (not
    the tests, which pick their own values): only the option table's row may say it."""
    spellings = "|".join(re.escape(s) for s in sorted(default_spellings(option.default), key=len, reverse=True))
    setting = re.compile(r"\b%s\b[\"']?\s*[:=]\s*(?:\w+\()?[\"']?(?:%s)(?![\w.])" % (re.escape(option.name), spellings))
    row = re.compile(r"Option\(\"%s\".*\bdefault=[\"']?(?:%s)(?![\w.])" % (re.escape(option.name), spellings))
    found = []
    for path in product_files():
        try:
            text = (REPO / path).read_text()
        except UnicodeDecodeError:
            continue
        found += [(path, line.strip()) for line in hand_written_lines(text) if setting.search(line) or row.search(line)]
    assert [path for path, _line in found] == ["plugins/module_utils/_hermes/options.py"], found


def test_role_declares_the_bare_engine_option_names_it_refuses():
    """Declared in the argument specs (by hand, after the generated block) so that Ansible's
    own check lets a role parameter written without its prefix reach the role's first task,
    which fails naming the variable meant: exactly the names the role's check refuses."""
    from ansible_collections.hermes_agent.ops.plugins.filter.variables import bare_option_names

    bare = sorted(name for name in role_specs() if not name.startswith(PREFIX))
    assert bare == bare_option_names(OPTIONS.BY_NAME), bare
    for name in bare:
        assert role_specs()[name]["description"].startswith("Not a role variable; use O(%s%s)" % (PREFIX, name))
