"""Prompt data from real files (jsonl, json, csv, parquet, a save_to_disk directory), column maps,
their errors, extra columns reaching reward functions, and chat templates at tokenization."""
import json
import os

import datasets
import pytest
import torch
from transformers import AutoTokenizer

from lightning_rlpt.rewards import score_experience
from lightning_rlpt.rollout.collect import to_experience, tokenize_prompts
from lightning_rlpt.data import PromptDataModule
from lightning_rlpt.rewards import RewardFunctions
from lightning_rlpt.rollout import RolloutOutput
from lightning_rlpt.rollout.sampling import SamplingConfig

ROWS = [{"question": f"{i}+1=", "solution": str(i + 1), "level": i % 3} for i in range(7)]
SOURCES = ["jsonl", "json", "csv", "parquet", "saved_dir", "dataset", "list"]


@pytest.fixture
def tokenizer(warm_start_dir):
    return AutoTokenizer.from_pretrained(warm_start_dir)


def write_source(kind, tmp_path, rows=ROWS):
    """The rows as a real file (or directory, or object) of the given kind."""
    path = str(tmp_path / f"prompts.{kind}")
    if kind == "jsonl":
        with open(path, "w") as f:
            f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    elif kind == "json":
        with open(path, "w") as f:
            json.dump(rows, f)
    elif kind in ("csv", "parquet"):
        getattr(datasets.Dataset.from_list(rows), f"to_{kind}")(path)
    elif kind == "saved_dir":
        datasets.Dataset.from_list(rows).save_to_disk(path)
    else:
        return {"dataset": datasets.Dataset.from_list(rows), "list": rows}[kind]
    return path


def all_batches(dm):
    dm.setup("fit")
    return list(dm.train_dataloader())


def seen_by_reward(batch, tokenizer, group_size=2):
    """What a reward function receives for this batch, through the real rollout path."""
    got = {}

    def spy(prompts, completions, **columns):
        got.update(columns, prompts=prompts)
        return [0.0] * len(completions)

    rows = [[1, 4] for _ in range(len(batch["prompt"]) * group_size)]
    exp = to_experience(RolloutOutput([[5, 2]] * len(rows)), rows, tokenizer, batch, group_size, SamplingConfig(),
                        torch.device("cpu"))
    score_experience(exp, RewardFunctions([spy]))
    return got


@pytest.mark.parametrize("kind", SOURCES)
def test_every_source_with_a_column_map(kind, tmp_path, tokenizer):
    data = write_source(kind, tmp_path)
    dm = PromptDataModule(data, prompt_column="question", columns={"solution": "answer"}, batch_size=3, shuffle=False)
    batches = all_batches(dm)
    assert [b["prompt"] for b in batches] == [["0+1=", "1+1=", "2+1="], ["3+1=", "4+1=", "5+1="], ["6+1="]]
    first = batches[0]
    assert set(first) == {"prompt", "answer", "level", "index"}
    # csv is untyped text to `datasets`, which infers ints back; every source keeps the values
    assert [str(a) for a in first["answer"]] == ["1", "2", "3"] and first["level"] == [0, 1, 2]
    got = seen_by_reward(first, tokenizer)
    assert got["prompts"] == ["0+1=", "0+1=", "1+1=", "1+1=", "2+1=", "2+1="]  # repeated per completion
    assert [str(a) for a in got["answer"]] == ["1", "1", "2", "2", "3", "3"]
    assert got["level"] == [0, 0, 1, 1, 2, 2] and got["index"] == [0, 0, 1, 1, 2, 2]
    assert got["completion_ids"] == [[5, 2]] * 6


def test_column_map_can_name_the_prompt(tmp_path):
    data = write_source("jsonl", tmp_path)
    dm = PromptDataModule(data, columns={"question": "prompt", "solution": "answer"}, batch_size=2, shuffle=False)
    assert all_batches(dm)[0] == {"prompt": ["0+1=", "1+1="], "answer": ["1", "2"], "level": [0, 1], "index": [0, 1]}


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "saved_dir"])
def test_column_map_naming_a_missing_column(kind, tmp_path):
    data = write_source(kind, tmp_path)
    with pytest.raises(ValueError, match=r"no column\(s\) \['answer'\]; its columns are "
                                         r"\['question', 'solution', 'level'\]\. Set prompt_column= / columns="):
        PromptDataModule(data, prompt_column="question", columns={"answer": "gold"}).setup("fit")
    with pytest.raises(ValueError, match=r"no column\(s\) \['problem'\]; its columns are \['question'"):
        PromptDataModule(data, prompt_column="problem").setup("fit")


def test_column_maps_that_clash():
    with pytest.raises(ValueError, match=r"\['answer'\] would clash.*columns=, e.g. columns=\{'solution': 'my_sol"):
        PromptDataModule(ROWS, prompt_column="question", columns={"solution": "answer", "level": "answer"}).setup()
    with pytest.raises(ValueError, match=r"\['completions'\] would clash.*reserved"):
        PromptDataModule(ROWS, prompt_column="question", columns={"solution": "completions"}).setup()
    with pytest.raises(ValueError, match=r"\['index'\] would clash.*e.g. columns=\{'index': 'my_index'\}"):
        PromptDataModule([{"prompt": "1+1=", "index": 7}]).setup()  # PromptDataModule sets `index` itself
    with pytest.raises(ValueError, match="map exactly one column to 'prompt'"):
        PromptDataModule(ROWS, columns={"question": "prompt", "solution": "prompt"}).setup()
    with pytest.raises(ValueError, match="prompt_column='level' and columns= mapping 'question' to 'prompt' disagree"):
        PromptDataModule(ROWS, prompt_column="level", columns={"question": "prompt"}).setup()


def test_missing_and_unreadable_paths(tmp_path):
    missing = str(tmp_path / "no_such_dir")
    with pytest.raises(FileNotFoundError, match=f"prompt data '{missing}' does not exist"):
        PromptDataModule(missing).setup("fit")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        PromptDataModule(ROWS, prompt_column="question", val_data=str(tmp_path / "val.parquet")).setup("fit")
    (tmp_path / "plain_dir").mkdir()
    with pytest.raises(ValueError, match="not one written by Dataset.save_to_disk"):
        PromptDataModule(str(tmp_path / "plain_dir")).setup("fit")


def test_dataset_dict_asks_for_a_split(tmp_path):
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS)})
    splits.save_to_disk(str(tmp_path / "dd"))
    train_dir = os.path.join(str(tmp_path / "dd"), "train")
    with pytest.raises(ValueError, match=rf"splits \['train', 'test'\]; pass one split, e.g. '{train_dir}'"):
        PromptDataModule(str(tmp_path / "dd")).setup("fit")
    with pytest.raises(ValueError, match=r"e.g. dataset_dict\['train'\]"):
        PromptDataModule(splits).setup("fit")
    dm = PromptDataModule(train_dir, prompt_column="question", batch_size=7)
    assert len(all_batches(dm)[0]["prompt"]) == 7


# -- chat templates ---------------------------------------------------------------------------
# The arithmetic tokenizer knows only 0-9 + = and <pad> <s> </s> (ids 0-2; "0" is 3, "+" 13, "=" 14),
# so the template marks a system turn with "=" and the generation prompt with "=".
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}={% endif %}{{ m['content'] }}"
            "{% endfor %}{% if add_generation_prompt %}={% endif %}")
ONE_PLUS_TWO = [1, 4, 13, 5]  # <s> 1 + 2


def test_string_prompts_with_and_without_a_template(tokenizer):
    assert tokenize_prompts(tokenizer, ["1+2"], SamplingConfig())[0] == [ONE_PLUS_TWO]  # no template: raw
    tokenizer.chat_template = TEMPLATE
    # one <s> (written by the template, not added again), then the generation prompt "="
    assert tokenize_prompts(tokenizer, ["1+2"], SamplingConfig())[0] == [ONE_PLUS_TWO + [14]]
    assert tokenize_prompts(tokenizer, ["1+2"], SamplingConfig(chat_template=False))[0] == [ONE_PLUS_TWO]


def test_conversational_prompts_from_a_file(tokenizer, tmp_path):
    conv = [{"role": "system", "content": "9"}, {"role": "user", "content": "1+2"}]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": conv, "answer": "3"}) + "\n")
    batch = all_batches(PromptDataModule(str(path), prompt_column="messages", batch_size=1))[0]
    assert batch["prompt"] == [conv]
    with pytest.raises(ValueError, match="needs a chat template, but the tokenizer has none: set tokenizer.chat_te"):
        tokenize_prompts(tokenizer, batch["prompt"], SamplingConfig())
    tokenizer.chat_template = TEMPLATE
    expected = [[1, 14, 12, 4, 13, 5, 14]]  # <s> = 9 1 + 2 =
    assert tokenize_prompts(tokenizer, batch["prompt"], SamplingConfig())[0] == expected
    assert tokenize_prompts(tokenizer, batch["prompt"], SamplingConfig(chat_template=False))[0] == expected


def test_templated_prompts_are_truncated_after_the_template(tokenizer):
    tokenizer.chat_template = TEMPLATE
    ids, cut = tokenize_prompts(tokenizer, ["1+2", "3"], SamplingConfig(max_prompt_length=3))
    assert ids == [[13, 5, 14], [1, 6, 14]] and cut == 1


# A template that reads a variable, as Qwen3's reads ``enable_thinking``: the generation prompt is
# "==" when thinking is switched off, "=" otherwise.
THINKING_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}"
                     "{% if enable_thinking is defined and not enable_thinking %}=={% else %}={% endif %}{% endif %}")


def test_chat_template_kwargs_reach_the_template(tokenizer):
    tokenizer.chat_template = THINKING_TEMPLATE
    off = SamplingConfig(chat_template_kwargs={"enable_thinking": False})
    assert tokenize_prompts(tokenizer, ["1+2"], SamplingConfig())[0] == [ONE_PLUS_TWO + [14]]
    assert tokenize_prompts(tokenizer, ["1+2"], off)[0] == [ONE_PLUS_TWO + [14, 14]]
    conv = [[{"role": "user", "content": "1+2"}]]
    assert tokenize_prompts(tokenizer, conv, off)[0] == [ONE_PLUS_TWO + [14, 14]]
    # raw string prompts do not go through the template, so the variable has nothing to change
    assert tokenize_prompts(tokenizer, ["1+2"], SamplingConfig(chat_template=False, chat_template_kwargs={
        "enable_thinking": False}))[0] == [ONE_PLUS_TWO]


def test_validation_formats_prompts_like_training(warm_start_dir):
    import tiny_task as task
    from lightning_rlpt import RLModule

    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2,
                      generation=dict(max_new_tokens=4, chat_template_kwargs={"enable_thinking": False}))
    module.tokenizer.chat_template = THINKING_TEMPLATE
    assert module.val_sampling.chat_template_kwargs == {"enable_thinking": False}
    assert module.val_sampling.temperature == 0
    assert tokenize_prompts(module.tokenizer, ["1+2"], module.val_sampling)[0] == [ONE_PLUS_TWO + [14, 14]]


@pytest.mark.parametrize("kwargs,match", [
    ("enable_thinking=False", r"chat_template_kwargs must be a dict of variable names to values, e.g. "
                              r"\{'enable_thinking': False\}"),
    ({1: True}, "chat_template_kwargs must be a dict of variable names"),
    ({"tokenize": True, "enable_thinking": False}, r"may not set \['tokenize'\]: the prompt tokenizer sets"),
    ({"add_generation_prompt": False}, r"may not set \['add_generation_prompt'\].*drop them"),
])
def test_bad_chat_template_kwargs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(chat_template_kwargs=kwargs)
