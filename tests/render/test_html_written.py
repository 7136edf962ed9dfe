"""`--html FILE` names the file it wrote, in one line on stderr: stdout stays the command's own output (a --json
document stays pure JSON), and `watch --follow`, which rewrites its page each update, names it once."""
from __future__ import annotations

import json

from memfit.interfaces.cli.main import main
from tests.render.test_html import LLAMA
from tests.render.test_html_run import leaky_run


def written_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("wrote the HTML report to ")]


def test_estimate_json_stays_pure_json_and_stderr_names_the_page(tmp_path, capsys):
    page = tmp_path / "estimate.html"
    assert main(["estimate", *LLAMA, "--json", "--html", str(page)]) == 0
    out = capsys.readouterr()
    json.loads(out.out)  # nothing but the document on stdout
    assert written_lines(out.err) == [f"wrote the HTML report to {page.resolve()} (open it in a browser)"]
    assert page.is_file()


def test_plan_names_the_page_it_wrote(tmp_path, capsys):
    page = tmp_path / "plan.html"
    assert main(["plan", *LLAMA, "--top", "2", "--html", str(page)]) == 0
    out = capsys.readouterr()
    assert str(page.resolve()) not in out.out and len(written_lines(out.err)) == 1 and page.is_file()


def test_watch_follow_names_its_page_once_though_it_rewrites_it(tmp_path, capsys):
    page = tmp_path / "watch.html"
    run = leaky_run(tmp_path)
    assert main(["watch", str(run), "--follow", "--until-steps", "40", "--json", "--html", str(page)]) == 0
    out = capsys.readouterr()
    for doc in out.out.splitlines():
        json.loads(doc)
    assert len(written_lines(out.err)) == 1 and str(page.resolve()) in out.err
