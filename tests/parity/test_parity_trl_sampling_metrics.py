"""TRL 1.16's ``sampling/*`` metrics of a rollout (its vLLM branch of ``_generate_and_score_completions``,
run from its installed source) against `mismatch_metrics`: the log-prob differences agree under
another name; the importance-sampling ratio TRL logs is the *corrected* one (truncated or masked,
one per sequence in the sequence modes), ours the raw token ratio: recorded as a difference."""
import pytest

from lightning_rlpt.algorithms.correction import mismatch_metrics
from parity_ours import parity_batch
from parity_record import compare, differs
from parity_trl import sampling_metrics, trl_config

MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
RATIO = [f"sampling/importance_sampling_ratio/{s}" for s in ("min", "mean", "max")]


@pytest.mark.parametrize("nan", [False, True])
def test_logp_differences_equal_trls_under_our_name(nan):
    batch = parity_batch(11, behaviour=True, nan_behaviour=nan)
    theirs = sampling_metrics(trl_config(), batch["logp"], batch["behaviour"], batch["mask"])
    ours = mismatch_metrics(batch["logp"], batch["behaviour"], batch["mask"])
    compare(f"sampling/logp_diff/* (TRL: sampling/sampling_logp_difference/*){', a NaN sampler log-prob' if nan else ''}",
            "TRL 1.16", {f"sampling/logp_diff/{s}": (ours[f"sampling/logp_diff/{s}"],
                                                      theirs[f"sampling/sampling_logp_difference/{s}"])
                         for s in ("mean", "max")})


@pytest.mark.parametrize("mode", MODES)
def test_the_logged_ratio_is_the_raw_token_ratio_where_trl_logs_the_corrected_one(mode):
    batch = parity_batch(12, behaviour=True)
    theirs = sampling_metrics(trl_config(vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_max=1.5),
                              batch["logp"], batch["behaviour"], batch["mask"])
    ours = mismatch_metrics(batch["logp"], batch["behaviour"], batch["mask"])
    differs(f"sampling/importance_sampling_ratio/* ({mode}, cap 1.5)", "TRL 1.16",
            {k: (ours[k], theirs[k]) for k in RATIO},
            "TRL logs the ratio after its truncation or mask (one per sequence in the sequence modes); "
            "here the raw per-token ratio π_old/π_behav")
