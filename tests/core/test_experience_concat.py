"""`Experience.concat` joins ``info`` per key (refills of `CurriculumSampler` concat experiences
whose ``info`` holds per-row episode counts and ``ref_entropy``)."""
import torch

from lightning_rlpt.experience import Experience


def experience(rows: int, width: int, info: dict) -> Experience:
    ids = torch.arange(rows * width).reshape(rows, width) + 3
    return Experience(prompt_ids=torch.ones(rows, 2, dtype=torch.long), prompt_mask=torch.ones(rows, 2, dtype=torch.long),
                      completion_ids=ids, completion_mask=torch.ones(rows, width, dtype=torch.long),
                      group_ids=torch.arange(rows // 2).repeat_interleave(2), group_size=2,
                      prompts=["p"] * rows, completions=[f"c{i}" for i in range(rows)], info=info)


def test_concat_joins_per_row_info_and_keeps_only_agreeing_batch_values():
    a = experience(2, 3, {"turns": torch.tensor([1, 2]), "ref_entropy": torch.ones(2, 3), "tag": "run",
                          "step": 4, "only_a": torch.tensor([7, 7]), "lr": torch.tensor(0.5)})
    b = experience(4, 5, {"turns": torch.tensor([3, 4, 5, 6]), "ref_entropy": torch.full((4, 5), 2.0), "tag": "run",
                          "step": 5, "only_b": "x", "lr": torch.tensor(0.5)})
    out = a.concat(b, pad_id=0)
    assert out.info["turns"].tolist() == [1, 2, 3, 4, 5, 6]
    assert out.info["ref_entropy"].tolist() == [[1.0] * 3 + [0.0] * 2] * 2 + [[2.0] * 5] * 4  # token axis padded with 0
    assert out.info["tag"] == "run" and float(out.info["lr"]) == 0.5  # the same on both sides: kept
    assert set(out.info) == {"turns", "ref_entropy", "tag", "lr"}  # "step" differs, "only_*" one-sided: dropped
    assert out.completion_ids.shape == (6, 5) and out.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    # Rows selected afterwards carry their own counts (a stale info of 2 rows would not follow).
    assert out.select([5, 0]).info["turns"].tolist() == [6, 1]


def test_concat_of_a_plain_rollout_with_no_info():
    out = experience(2, 3, {}).concat(experience(2, 3, {}), pad_id=0)
    assert out.info == {} and len(out) == 4
