"""TRL's helpers that several tests compare against: TRL's own functions, re-exported (TRL 1.16 is in
the test extra; this file once held transcriptions of them). The side-by-side runs of TRL's trainer
code are in tests/parity/."""
from trl.trainer.utils import nanstd  # noqa: F401  (trl/trainer/utils.py: Bessel's std of the non-NaN values)
