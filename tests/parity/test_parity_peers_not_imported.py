"""The peers are test peers only: importing the package and converting a config imports none of them."""
import subprocess
import sys


def test_the_package_imports_no_peer():
    code = ("import sys, lightning_rlpt, lightning_rlpt.compat.trl as c, lightning_rlpt.kernels; "
            "c.from_grpo_config({'beta': 0.04}); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'trl', 'verl', 'liger_kernel', 'ray'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
