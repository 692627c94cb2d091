"""The support table in docs/support.md and README.md is the one `benchmarks/zoo_table.py`
renders from the conformance matrix's committed JSON (never typed by hand)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_pages_show_the_table_rendered_from_the_matrix_json():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "zoo_table.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
