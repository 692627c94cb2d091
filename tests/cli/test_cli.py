"""The `lightning-rlpt` command line: a 3-step fit of examples/arithmetic/config.yaml through the
installed console script, run from a scratch directory laid out like the repository root (the
shipped logger and ModelCheckpoint, plus a callback set from YAML), --print_config, unknown keys and
commands, `plot` on the fit's metrics and on a directory without any, and `export` of the checkpoint
at the path the README and docs/cli.md give (tests/test_export.py checks what an export computes)."""
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from conftest import ARITHMETIC, ROOT

sys.path.insert(0, ARITHMETIC)  # the shipped config's example (its task module)
import task  # noqa: E402
from lightning_rlpt.cli import find_metrics, main
from lightning_rlpt.cli.plotting import CURVES, plot_metrics

CONFIG = os.path.join(ARITHMETIC, "config.yaml")
SCRIPT = os.path.join(os.path.dirname(sys.executable), "lightning-rlpt")  # `pip install -e .` puts it there
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHECKPOINT = "runs/arithmetic-cli/checkpoints/last.ckpt"  # what a fit of the shipped config writes (relative to cwd)


def override(tmp_path, **sections) -> str:
    path = tmp_path / "override.yaml"
    path.write_text(yaml.safe_dump(sections))
    return str(path)


@pytest.fixture(scope="module")
def fit_run(tmp_path_factory):
    """``lightning-rlpt fit`` for 3 steps (a validation at step 2, none at the end): the shipped config
    (its logger and ModelCheckpoint untouched) plus an override file, run from a scratch working
    directory whose ``examples`` is the repository's, so what the run writes lands under it."""
    assert os.path.exists(SCRIPT), f"no {SCRIPT}: `pip install -e .` installs the lightning-rlpt console script"
    tmp = tmp_path_factory.mktemp("cli_fit")
    os.symlink(os.path.join(ROOT, "examples"), tmp / "examples")
    dither = {"class_path": "lightning_rlpt.callbacks.RewardDithering", "init_args": {"scale": 0.05}}
    shipped = yaml.safe_load(open(CONFIG))["trainer"]["callbacks"]  # a later list replaces it: keep it in
    extra = override(tmp, trainer={"max_steps": 3, "val_check_interval": 2, "callbacks": shipped + [dither],
                                   "enable_progress_bar": False},
                     model={"group_size": 4, "memory": {"micro_batch_size": 2}},  # a group from YAML (options.py)
                     data={"batch_size": 2})  # validation: one batch of 300
    out = subprocess.run([SCRIPT, "fit", "--config", "examples/arithmetic/config.yaml", "--config", extra],
                         cwd=tmp, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp


def test_fit_from_config_logs_rewards_and_runs_yaml_callbacks(fit_run):
    csv_path = find_metrics(str(fit_run / "runs" / "arithmetic-cli"))
    assert csv_path.endswith(os.path.join("lightning_logs", "version_0", "metrics.csv"))
    header = open(csv_path).readline().strip().split(",")
    assert {"reward", "val/accuracy", "redit/scale"} <= set(header)  # redit/*: the callback named in YAML ran
    saved = yaml.safe_load(open(os.path.join(os.path.dirname(csv_path), "config.yaml")))
    assert saved["model"]["reward_funcs"] == ["task:exact_answer"] and saved["trainer"]["max_steps"] == 3


def test_the_configs_optimizer_and_schedule_take_effect(fit_run):
    """The config's AdamW(lr=3e-5) with WarmupCosineLR(total 200, warm-up 10): the module logs, at
    each step, the learning rate that step used: 3e-5 · s / 10 during the warm-up (no
    LearningRateMonitor in the config, so no lr-AdamW copy of it)."""
    csv_path = find_metrics(str(fit_run / "runs" / "arithmetic-cli"))
    lrs = {}
    with open(csv_path) as f:
        reader = __import__("csv").DictReader(f)
        for row in reader:
            if row.get("learning_rate"):
                lrs[int(row["step"])] = float(row["learning_rate"])
    float32 = {step: torch.tensor(lr, dtype=torch.float32).item() for step, lr in {0: 0.0, 1: 3e-6, 2: 6e-6}.items()}
    assert lrs == pytest.approx(float32, rel=1e-9, abs=1e-15)  # self.log keeps a float32
    assert not [name for name in reader.fieldnames if name.startswith("lr-")]


def test_docs_give_the_checkpoint_path_a_fit_writes():
    """Every checkpoint path the README, docs/cli.md and the config name is the one ModelCheckpoint writes."""
    texts = {name: open(os.path.join(ROOT, name)).read() for name in ("README.md", "docs/cli.md")}
    texts["config.yaml"] = open(CONFIG).read()
    for name, text in texts.items():
        paths = set(re.findall(r"runs/arithmetic-cli/\S*\.ckpt", text))
        assert paths == {CHECKPOINT}, (name, paths)
    (checkpoint,) = [c for c in yaml.safe_load(open(CONFIG))["trainer"]["callbacks"]
                     if c["class_path"].endswith("ModelCheckpoint")]
    args = checkpoint["init_args"]
    assert os.path.join(args["dirpath"], "last.ckpt") == CHECKPOINT and args["save_last"] is True


def test_fit_writes_the_final_checkpoint_at_the_documented_path(fit_run):
    ckpt = torch.load(fit_run / CHECKPOINT, map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 3  # saved when the fit ended, not only at the validation of step 2
    assert ckpt["hyper_parameters"]["micro_batch_size"] == 2 and "memory" not in ckpt["hyper_parameters"]
    assert "policy.model.embed_tokens.weight" in ckpt["state_dict"]


def test_validate_and_a_resumed_fit_take_the_checkpoint(fit_run, tmp_path):
    """``--ckpt_path``: LightningCLI feeds the checkpoint's hyper-parameters back as ``model.*``
    options, so every one of them must be a constructor argument. ``validate`` scores the
    checkpoint's policy; ``fit`` resumes from step 3 to 4 (in a scratch copy of the run)."""
    os.symlink(os.path.join(ROOT, "examples"), tmp_path / "examples")
    os.makedirs(tmp_path / os.path.dirname(CHECKPOINT))
    shutil.copy(fit_run / CHECKPOINT, tmp_path / CHECKPOINT)
    quiet = override(tmp_path, trainer={"max_steps": 4, "enable_progress_bar": False}, model={"group_size": 4},
                     data={"batch_size": 2})
    for command in ("validate", "fit"):
        out = subprocess.run([SCRIPT, command, "--config", "examples/arithmetic/config.yaml", "--config", quiet,
                              "--ckpt_path", CHECKPOINT], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (command, out.stderr[-3000:])
        if command == "validate":
            assert "val/accuracy" in out.stdout
    resumed = torch.load(tmp_path / CHECKPOINT, map_location="cpu", weights_only=False)
    assert resumed["global_step"] == 4 and resumed["lightning_rlpt"]["policy_version"] == 4


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
    (checkpoint,) = printed["trainer"]["callbacks"]  # no LearningRateMonitor: the module logs learning_rate
    assert checkpoint["class_path"].endswith("ModelCheckpoint") and checkpoint["init_args"]["save_last"] is True
    assert printed["model"]["optimizer"]["class_path"] == "torch.optim.AdamW"
    assert printed["model"]["lr_scheduler"]["class_path"] == "lightning_rlpt.optim.WarmupCosineLR"
    assert "optimizer" not in printed  # LightningCLI's own optimizer keys are off: the module's arguments hold them


def test_unknown_key_fails_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", CONFIG, "--config", override(tmp_path, model={"group_sise": 4})])
    assert exit_.value.code != 0
    assert "model.group_sise" in capsys.readouterr().err


def test_option_prefixes_are_not_taken_for_options(capsys):
    """``--model.beta`` (TRL's name) is refused as unknown, in a short message, not prefix-matched to
    ``--model.betas`` (then failing on its value after 113 lines of usage); the full name still works."""
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", CONFIG, "--model.beta", "0.04", "--print_config"])
    assert exit_.value.code != 0
    err = capsys.readouterr().err
    assert "unrecognized arguments: --model.beta 0.04" in err and len(err.splitlines()) <= 5, err
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", CONFIG, "--model.betas", "[0.9, 0.95]", "--print_config"])
    assert exit_.value.code in (0, None)
    assert yaml.safe_load(capsys.readouterr().out)["model"]["betas"] == [0.9, 0.95]


def test_help_lists_the_commands_and_unknown_ones_fail(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("fit", "validate", "plot", "export"))
    assert main(["train"]) == 2
    assert "unknown command 'train'" in capsys.readouterr().err


def test_python_dash_m_is_the_command(tmp_path):
    """``python -m lightning_rlpt`` runs the same entry point as ``lightning-rlpt``, exit status
    included, from any directory."""
    ok = subprocess.run([sys.executable, "-m", "lightning_rlpt", "--help"], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0 and all(name in ok.stdout for name in ("fit", "validate", "plot", "export")), ok.stderr
    bad = subprocess.run([sys.executable, "-m", "lightning_rlpt", "train"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "unknown command 'train'" in bad.stderr


def drawn_panels(monkeypatch) -> dict[str, str]:
    """Filled, as each figure is saved, with ``{panel title: y scale}``."""
    from matplotlib.figure import Figure

    drawn, save = {}, Figure.savefig

    def record(fig, *args, **kwargs):
        drawn.update({ax.get_title(): ax.get_yscale() for ax in fig.axes})
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    return drawn


def test_plot_writes_a_png_of_the_run(fit_run, tmp_path, capsys, monkeypatch):
    png, drawn = tmp_path / "curves.png", drawn_panels(monkeypatch)
    assert main(["plot", str(fit_run / "runs" / "arithmetic-cli"), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 1000
    assert str(png) in capsys.readouterr().out
    header = open(find_metrics(str(fit_run / "runs" / "arithmetic-cli"))).readline().strip().split(",")
    assert set(drawn) == {title for key, title in CURVES if key in header}  # a panel per metric logged
    assert {"reward", "held-out accuracy", "learning rate", "throughput (tokens/s)"} <= set(drawn)


NEW_PANELS = {"learning_rate": ("learning rate", "linear"), "throughput/tokens_per_s": ("throughput (tokens/s)", "linear"),
              "sampling/parity_max": ("parity probe: max |Δ log p|", "symlog"),
              "sampling/logp_diff/max": ("sampled vs trained: max |Δ log p|", "symlog")}


@pytest.mark.parametrize("metrics", [[key] for key in NEW_PANELS] + [list(NEW_PANELS)])
def test_plot_draws_a_panel_exactly_for_each_metric_present(metrics, tmp_path, monkeypatch):
    """A CSV with reward, loss (no panel) and some of the metrics gets a panel for reward and for each
    of them. The rollout-vs-trainer log-prob gaps (~1e-7 to 1, or exactly 0) get a log axis that shows 0."""
    keys = ["reward", "loss", *metrics]
    rows = [[step, 0, *(10.0 ** -(step * 3) if "sampling/" in key else step + 1.0 for key in keys)]
            for step in range(3)]  # the gaps: 1, 1e-3, 1e-6
    rows[0][-1] = 0.0
    (tmp_path / "metrics.csv").write_text("\n".join(",".join(map(str, row)) for row in [["step", "epoch", *keys], *rows]))
    drawn = drawn_panels(monkeypatch)
    plot_metrics(str(tmp_path / "metrics.csv"), str(tmp_path / "curves.png"))
    assert drawn == {"reward": "linear", **dict(NEW_PANELS[key] for key in metrics)}


def test_plot_of_a_run_without_metrics_says_what_it_expected(tmp_path, capsys):
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main(["plot", str(tmp_path / "empty_run")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "no metrics.csv" in err and "CSVLogger" in err


def test_export_of_the_documented_checkpoint_writes_a_hf_directory(fit_run, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(fit_run)  # the README's command as written, from the directory the fit ran in
    assert main(["export", CHECKPOINT, "exported/"]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(fit_run / "exported"))
    state = torch.load(CHECKPOINT, map_location="cpu", weights_only=False)["state_dict"]
    exported = AutoModelForCausalLM.from_pretrained(fit_run / "exported").state_dict()
    assert all(torch.equal(value, state[f"policy.{name}"]) for name, value in exported.items())
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(tmp_path / "missing.ckpt"), str(tmp_path / "out2")])
    assert exit_.value.code == 2 and "no checkpoint at" in capsys.readouterr().err


def test_committed_prompt_files_are_the_tasks_split(tmp_path):
    train, val, dev = task.write_jsonl(str(tmp_path))
    for new, name in ((train, "train.jsonl"), (val, "val.jsonl"), (dev, "dev.jsonl")):
        regenerate = f"stale {name}: run python examples/arithmetic/task.py"
        assert open(new).read() == open(os.path.join(ARITHMETIC, name)).read(), regenerate
