"""The README's Python program runs as written, on 8 local ranks (python3 -m hcomm.run)."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_block(tmp_path):
    pytest.importorskip("torch")
    section = README.read_text().split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "brief.py"
    script.write_text(code + "print('readme ok', hcomm.get_rank(), tp_group.rank, "
                             "int(counts.sum()) >= 0, flush=True)\n")
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]),
               HCOMM_TIMEOUT="60")
    p = subprocess.run([sys.executable, "-m", "hcomm.run", "-n", "8", str(script)], env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("readme ok") == 8, p.stdout
