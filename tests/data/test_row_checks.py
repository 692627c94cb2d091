"""Every prompt row is checked when the data is loaded: a row missing a column (or with a
misspelt key), a prompt that is not a string or messages, a line that is not JSON and a file
that is not UTF-8 are refused naming the file and the row, before any rollout."""
import json

import pytest

from lightning_rlpt.data import PromptDataModule, PromptDataset

ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(6)]


def setup(data, **kwargs):
    dm = PromptDataModule(data, batch_size=2, **kwargs)
    dm.setup("fit")
    return dm


def write(tmp_path, rows, kind="jsonl"):
    path = tmp_path / f"prompts.{kind}"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n" if kind == "jsonl" else json.dumps(rows))
    return str(path)


def misspelt(rows, i=3):
    rows = [dict(r) for r in rows]
    rows[i]["anwser"] = rows[i].pop("answer")
    return rows


@pytest.mark.parametrize("kind, where", [("jsonl", r"row 3 \(line 4\)"), ("json", "row 3")])
def test_a_misspelt_key_in_a_file_names_the_file_row_and_column(tmp_path, kind, where):
    path = write(tmp_path, misspelt(ROWS), kind)  # today: `datasets` gives row 3 answer=None, scored 0 silently
    with pytest.raises(ValueError, match=rf"prompts.{kind}'?: column 'answer' is missing from 1 of 6 rows \(first: "
                                         rf"{where}, whose columns are \['prompt', 'anwser'\]; row 0.* has it\).*"
                                         "correct a misspelt key"):
        setup(path)


def test_a_row_missing_a_column_in_a_jsonl_file(tmp_path):
    rows = [dict(r) for r in ROWS]
    del rows[5]["answer"]
    with pytest.raises(ValueError, match=r"column 'answer' is missing from 1 of 6 rows \(first: row 5 \(line 6\)"):
        setup(write(tmp_path, rows))


def test_null_where_a_column_does_not_apply_is_accepted(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[2]["answer"] = None  # written explicitly: a multi-task row the reward returns None for
    dm = setup(write(tmp_path, rows), shuffle=False)
    assert dm.train_set[2]["answer"] is None


@pytest.mark.parametrize("missing", ["answer", "prompt"])
def test_a_list_row_missing_a_column_is_a_clear_error_not_a_key_error(missing):
    rows = [dict(r) for r in ROWS]
    del rows[4][missing]
    with pytest.raises(ValueError, match=rf"the list of prompt rows: column '{missing}' is missing from 1 of 6 rows "
                                         r"\(first: row 4"):
        setup(rows)
    with pytest.raises(ValueError, match=rf"the dataset: column '{missing}' is missing from 1 of 6 rows \(first: row 4"):
        PromptDataset(rows)  # built directly, without load_rows


@pytest.mark.parametrize("bad, kind", [(None, "a NoneType"), (7, "an int"), ([], "a list"), (["1+1="], "a list")])
def test_a_prompt_that_is_not_text_or_messages_names_the_row(bad, kind):
    rows = [dict(r) for r in ROWS]
    rows[2]["prompt"] = bad  # today: None reaches the tokenizer ("'NoneType' object is not iterable")
    with pytest.raises(ValueError, match=rf"the training dataset: row 2 has .* \({kind}\) in its prompt column "
                                         "'prompt'; a prompt is a string, or a list of"):
        setup(rows)
    with pytest.raises(ValueError, match=r"row 2 has None \(a NoneType\)"):
        setup([r["prompt"] for r in ROWS[:2]] + [None])  # a list of strings with a None


def test_a_null_prompt_in_a_file_names_the_file_and_the_row_before_the_split(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[5]["prompt"] = None
    # With val_fraction the rows are shuffled: the error still counts them as the file does.
    with pytest.raises(ValueError, match=r"training dataset '.*prompts.jsonl': row 5 has None"):
        setup(write(tmp_path, rows), val_fraction=0.5)


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv"])
def test_a_file_that_is_not_utf8_names_the_file_and_line(tmp_path, kind):
    path = tmp_path / f"prompts.{kind}"
    if kind == "csv":
        path.write_bytes(b"prompt,answer\ncaf\xe9,3\n")  # line 1 is the header
    elif kind == "json":
        path.write_bytes(b'[{"prompt": "1+1=", "answer": "2"},\n {"prompt": "caf\xe9", "answer": "3"}]')
    else:
        path.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "3"}\n')
    with pytest.raises(ValueError, match=rf"prompts.{kind}' is not UTF-8 text: line 2 \(byte \d+\) has 0xe9.*"
                                         "Save it as UTF-8"):
        setup(str(path))


def test_a_jsonl_line_that_is_not_json_names_the_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "2+2=", "answer": 4,}\n')
    with pytest.raises(ValueError, match=r"line 3 of '.*prompts.jsonl' is not a JSON object"):
        setup(str(path))


def test_an_empty_jsonl_is_refused_naming_the_file(tmp_path):
    """Issue 37: an empty .jsonl failed with a bare StopIteration from `datasets`, naming no file."""
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n")
    with pytest.raises(ValueError, match=rf"prompt data '{path}' is empty: it holds no rows"):
        PromptDataModule(str(path)).setup("fit")


@pytest.mark.parametrize("line", ["[1, 2]", '"text"', "3"])
def test_a_json_line_that_is_not_an_object_is_refused_naming_the_line(tmp_path, line):
    """Issue 37: a valid JSON line that is not an object gave `DatasetGenerationError` without a line."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n\n' + line + '\n{"prompt": "2+2=", "answer": "4"}\n')
    with pytest.raises(ValueError, match=rf"line 3 of '{path}' is valid JSON but not an object: .*fix or remove that row"):
        PromptDataModule(str(path)).setup("fit")


def test_a_json_list_item_that_is_not_an_object_is_refused(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[{"prompt": "1+1=", "answer": "2"}, [1, 2]]')
    with pytest.raises(ValueError, match=rf"item 1 of its list of '{path}' is valid JSON but not an object"):
        PromptDataModule(str(path)).setup("fit")
