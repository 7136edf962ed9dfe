"""A fact holds for the release it was derived on: the pins, the installs, and every recorded version agree.

memfit/facts/data/versions.toml names the releases; each check below fails when one place moves alone
(an extra loosened, a new release installed, a fact file or bench record derived on another release).
"""
import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from memfit.facts.versions import installed, mismatches, pinned, release

ROOT = Path(__file__).resolve().parent.parent
TABLES = ROOT / "memfit" / "interfaces" / "formats" / "tables"


def _pins_in(requirements: list[str]) -> dict[str, str]:
    return {Requirement(r).name: str(Requirement(r).specifier) for r in requirements}


def test_every_installed_fact_producer_is_the_pinned_release():
    assert mismatches() == {}, "installed releases differ from memfit/facts/data/versions.toml " \
                               "(install with -c constraints.txt, or re-derive the facts and move the pins)"


def test_the_extras_pin_exactly_the_table():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    seen = set()
    for extra, requirements in extras.items():
        for name, spec in _pins_in(requirements).items():
            if name in pinned():
                assert spec == f"=={pinned()[name]}", f"extra {extra!r} asks for {name}{spec}"
                seen.add(name)
    assert seen == set(pinned()), f"pinned but in no extra: {set(pinned()) - seen}"


def test_constraints_file_pins_the_table():
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    lock = dict(line.split("==", 1) for line in lines if line and not line.startswith("#"))
    lower = {k.lower().replace("_", "-"): v for k, v in lock.items()}
    for name, pin in pinned().items():
        assert lower.get(name.lower().replace("_", "-")) == pin, f"constraints.txt: {name}"


def test_llamafactory_venv_installs_the_pinned_release():
    venv = tomllib.loads((ROOT / "memfit" / "facts" / "data" / "versions.toml").read_text())["venv"]
    script = (ROOT / "tests" / "formats" / "setup_llamafactory_venv.sh").read_text()
    assert f"llamafactory=={venv['llamafactory']}" in script
    assert json.loads((TABLES / "llamafactory.json").read_text())["source"] == f"llamafactory {venv['llamafactory']}"


@pytest.mark.parametrize("table", ["deepspeed", "hf", "accelerate"])
def test_framework_key_tables_were_derived_on_the_pins(table):
    source = json.loads((TABLES / f"{table}.json").read_text())["source"]
    for name, got in re.findall(r"([\w-]+) ([\d.]+)", source):
        assert got == pinned()[name], f"tables/{table}.json derived on {name} {got}"


def test_derived_fact_tables_were_derived_on_the_pins():
    data = ROOT / "memfit" / "facts" / "data"
    peft = tomllib.loads((data / "peft.toml").read_text())
    assert (peft["peft"], release(peft["torch"])) == (pinned()["peft"], pinned()["torch"])
    assert tomllib.loads((data / "activations.toml").read_text())["transformers"] == pinned()["transformers"]


def test_bench_records_were_made_on_the_pins():
    entries = json.loads((ROOT / "bench" / "trace_cache.json").read_text())["entries"].values()
    stamps = {tuple(sorted((k, release(v)) for k, v in e["versions"].items())) for e in entries}
    assert stamps == {tuple(sorted((k, pinned()[k]) for k in ("peft", "torch", "transformers")))}
    for row in json.loads((ROOT / "bench" / "engine_measured.json").read_text()):  # the real engines' runs
        assert {k: release(v) for k, v in row["versions"].items() if v} == \
               {k: v for k, v in pinned().items() if row["versions"].get(k)}, row["scenario"]


def test_installed_names_every_pinned_package():
    got = installed()
    assert set(got) == set(pinned())
    assert all(v is None or release(v)[0].isdigit() for v in got.values())


def test_verl_venv_installs_the_release_its_facts_were_read_on():
    venv = tomllib.loads((ROOT / "memfit" / "facts" / "data" / "versions.toml").read_text())["venv"]
    assert f'VERL="verl=={venv["verl"]}"' in (ROOT / "tests" / "trace" / "setup_verl_venv.sh").read_text()
    assert f'[release."{venv["verl"]}"]' in (ROOT / "memfit" / "facts" / "data" / "verl_fsdp.toml").read_text()
    assert json.loads((TABLES / "verl.json").read_text())["version"] == venv["verl"]
