"""The format readers and writers are core: PyYAML only, no torch, no framework."""
import subprocess
import sys


def test_formats_import_no_torch_and_no_framework():
    code = ("import sys, memfit.interfaces.formats, memfit.interfaces.formats.validate; "
            "bad = [m for m in ('torch', 'deepspeed', 'transformers', 'trl', 'accelerate') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
