"""Issue 30: the HTML report ends with what to do next, as the terminal does: an estimate's changes that fit and
the plan command; a plan's command that checks plan 1."""
import json
import re
from html import unescape

from memfit.interfaces.cli.main import main

OOM = ["meta-llama/Llama-3.1-8B-Instruct", "--gpu", "rtx4090", "--gpus-per-node", "7", "--profile", "llamafactory",
       "--tuning", "lora", "--lora-rank", "8", "--seq-len", "2048", "--precision", "bf16-pure", "--micro-batch", "4"]


def _next_items(page) -> list[str]:
    block = re.search(r'<h2>next</h2>\s*<ul id="next">(.*?)</ul>', page.read_text(), flags=re.S)
    assert block, "no next section"
    return [unescape(re.sub(r"<[^>]+>", "", li)) for li in re.findall(r"<li>(.*?)</li>", block.group(1))]


def test_the_estimate_page_ends_with_the_same_next_steps_as_the_json(tmp_path, capsys):
    page = tmp_path / "e.html"
    assert main(["estimate", *OOM, "--json", "--html", str(page)]) == 0
    doc = json.loads(capsys.readouterr().out)
    items = _next_items(page)
    assert doc["next_steps"] and len(items) == len(doc["next_steps"]) + 1
    for item, step in zip(items, doc["next_steps"]):
        assert item.startswith("add " + " ".join(step["flags"]) + ":")
    assert items[-1] == doc["plan_command"]


def test_the_plan_page_ends_with_the_command_that_checks_plan_one(tmp_path, capsys):
    page = tmp_path / "p.html"
    assert main(["plan", *OOM, "--top", "2", "--json", "--html", str(page)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["next_command"].startswith("memfit estimate ")
    assert _next_items(page) == [doc["next_command"]]
