"""The `lightning-rlpt` command line: a 2-step fit of examples/arithmetic/config.yaml through the
installed console script (a callback and a CSV logger set from YAML), --print_config, unknown
keys and commands, `plot` on the fit's metrics and on a directory without any, and `export` of
the fit's checkpoint (tests/test_export.py checks what an export computes)."""
import glob
import os
import subprocess
import sys

import pytest
import yaml

from conftest import ARITHMETIC, ROOT

sys.path.insert(0, ARITHMETIC)  # the shipped config's example (its task module)
import task  # noqa: E402
from lightning_rlpt.cli import find_metrics, main

CONFIG = os.path.join(ARITHMETIC, "config.yaml")
SCRIPT = os.path.join(os.path.dirname(sys.executable), "lightning-rlpt")  # `pip install -e .` puts it there
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def override(tmp_path, **sections) -> str:
    path = tmp_path / "override.yaml"
    path.write_text(yaml.safe_dump(sections))
    return str(path)


@pytest.fixture(scope="module")
def fit_run(tmp_path_factory):
    """``lightning-rlpt fit`` for 2 steps: the demo config plus an override file, run from the root."""
    assert os.path.exists(SCRIPT), f"no {SCRIPT}: `pip install -e .` installs the lightning-rlpt console script"
    tmp = tmp_path_factory.mktemp("cli_fit")
    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp / "run")}}
    dither = {"class_path": "lightning_rlpt.callbacks.RewardDithering", "init_args": {"scale": 0.05}}
    extra = override(tmp, trainer={"max_steps": 2, "val_check_interval": 2, "logger": logger, "callbacks": [dither],
                                   "enable_progress_bar": False},
                     model={"group_size": 4}, data={"batch_size": 2})  # validation: one batch of 300
    out = subprocess.run([SCRIPT, "fit", "--config", CONFIG, "--config", extra],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp / "run"


def test_fit_from_config_logs_rewards_and_runs_yaml_callbacks(fit_run):
    csv_path = find_metrics(str(fit_run))
    assert csv_path.endswith(os.path.join("version_0", "metrics.csv"))
    header = open(csv_path).readline().strip().split(",")
    assert {"reward", "val/accuracy", "redit/scale"} <= set(header)  # redit/*: the callback named in YAML ran
    saved = yaml.safe_load(open(os.path.join(os.path.dirname(csv_path), "config.yaml")))
    assert saved["model"]["reward_funcs"] == ["task:exact_answer"] and saved["trainer"]["max_steps"] == 2
    assert any(name.endswith(".ckpt") for name in os.listdir(os.path.join(os.path.dirname(csv_path), "checkpoints")))


def test_print_config_shows_module_data_and_trainer_keys(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", CONFIG, "--print_config"])
    assert exit_.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["reward_funcs"] == ["task:exact_answer"]
    assert printed["model"]["generation"]["max_new_tokens"] == 4 and printed["model"]["kl_coef"] == 0.001
    assert {"lora", "quantization", "updates_per_rollout", "rollout_correction"} <= set(printed["model"])
    assert printed["data"]["data"] == "examples/arithmetic/train.jsonl" and printed["data"]["val_batch_size"] == 300
    assert printed["trainer"]["max_steps"] == 200
    assert "optimizer" not in printed  # RLModule builds its own AdamW from lr / weight_decay / betas


def test_unknown_key_fails_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", CONFIG, "--config", override(tmp_path, model={"group_sise": 4})])
    assert exit_.value.code != 0
    assert "model.group_sise" in capsys.readouterr().err


def test_help_lists_the_commands_and_unknown_ones_fail(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("fit", "validate", "plot", "export"))
    assert main(["train"]) == 2
    assert "unknown command 'train'" in capsys.readouterr().err


def test_plot_writes_a_png_of_the_run(fit_run, tmp_path, capsys):
    png = tmp_path / "curves.png"
    assert main(["plot", str(fit_run), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 1000
    assert str(png) in capsys.readouterr().out


def test_plot_of_a_run_without_metrics_says_what_it_expected(tmp_path, capsys):
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main(["plot", str(tmp_path / "empty_run")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "no metrics.csv" in err and "CSVLogger" in err


def test_export_writes_the_fits_checkpoint_as_a_hf_directory(fit_run, tmp_path, warm_start_dir, capsys):
    (ckpt,) = glob.glob(os.path.join(os.path.dirname(find_metrics(str(fit_run))), "checkpoints", "*.ckpt"))
    assert main(["export", ckpt, str(tmp_path / "out"), "--model", warm_start_dir]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(tmp_path / "out"))
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(tmp_path / "missing.ckpt"), str(tmp_path / "out2")])
    assert exit_.value.code == 2 and "no checkpoint at" in capsys.readouterr().err


def test_committed_prompt_files_are_the_tasks_split(tmp_path):
    train, val = task.write_jsonl(str(tmp_path))
    for new, name in ((train, "train.jsonl"), (val, "val.jsonl")):
        regenerate = f"stale {name}: run python examples/arithmetic/task.py"
        assert open(new).read() == open(os.path.join(ARITHMETIC, name)).read(), regenerate
