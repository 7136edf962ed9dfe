"""Issue 30: no silent waits. A step past about a second says what it is doing on stderr, when stderr is a terminal
and the output is not --json; a pipe gets nothing. Checked on an injected stream and on a real pseudo-terminal."""
import io
import os
import pty
import subprocess
import sys
import time

from memfit.interfaces.cli.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_slow_step_on_a_terminal_says_what_it_does_and_wipes_the_line():
    stream = Terminal()
    with Progress("searching configurations", stream=stream, delay=0.05):
        time.sleep(0.4)
    text = stream.getvalue()
    assert text.startswith("\rsearching configurations ... ") and " s\x1b[K" in text
    assert text.endswith("\r\x1b[K")  # the line is gone when the step ends


def test_a_quick_step_a_pipe_and_json_print_nothing():
    quick, pipe, json = Terminal(), io.StringIO(), Terminal()
    with Progress("quick", stream=quick, delay=0.5):
        pass
    with Progress("piped", stream=pipe, delay=0.0):
        time.sleep(0.1)
    with Progress("json", stream=json, quiet=True, delay=0.0):
        time.sleep(0.1)
    assert quick.getvalue() == pipe.getvalue() == json.getvalue() == ""


PLAN = ["plan", "llama-2-7b", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "openrlhf", "--method", "ppo",
        "--zero", "3", "--micro-batch", "4", "--seq", "2048", "--ckpt", "--colocate", "all", "--vllm-tp", "2",
        "--vllm-mem", "0.5", "--top", "2"]  # a search of about a second


def _on_a_terminal(argv) -> tuple[str, str]:
    """The command with stderr on a pseudo-terminal and stdout on a pipe: (stdout, what the terminal got)."""
    leader, follower = pty.openpty()
    # a shorter delay than the second a user waits: the search is not slow enough on every machine to show it
    code = ("import sys; import memfit.interfaces.cli.progress as p; p.DELAY_S = 0.05; "
            "from memfit.interfaces.cli.main import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, stderr=follower,
                            env=os.environ | {"COLUMNS": "200"})
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the follower side closed: the command ended
            break
        if not chunk:
            break
        seen += chunk
    out = proc.stdout.read().decode()
    assert proc.wait() == 0
    os.close(leader)
    return out, seen.decode(errors="replace")


def test_plan_on_a_terminal_shows_its_search_and_keeps_stdout_clean():
    out, terminal = _on_a_terminal(PLAN)
    assert "searching configurations of meta-llama/Llama-2-7b-hf" in terminal
    assert "\x1b[K" not in out and out.splitlines()[0].endswith("per GPU")  # stdout: the answer alone
    out, terminal = _on_a_terminal([*PLAN, "--json"])
    assert "searching" not in terminal and out.lstrip().startswith("{")
