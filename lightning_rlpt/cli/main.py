"""The ``lightning-rlpt`` command line: train from a YAML config, plot a run, export a checkpoint.

``fit`` and ``validate`` are Lightning's ``LightningCLI`` over `RLModule` and `PromptDataModule`:
every argument of both, the Trainer's and its callbacks' are config keys (``--print_config``
shows them all). ``plot`` and ``export`` are small commands of their own. See docs/cli.md.

Examples:
    $ lightning-rlpt fit --config examples/arithmetic/config.yaml --trainer.max_steps 20
    $ lightning-rlpt plot runs/arithmetic-cli
    $ lightning-rlpt export runs/arithmetic-cli/lightning_logs/version_0/checkpoints/epoch=0-step=200.ckpt out/
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
from typing import Any, Sequence

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from ..data import PromptDataModule
from ..module import RLModule

PROG = "lightning-rlpt"
COMMANDS = {
    "fit": "train an RLModule on a PromptDataModule from a YAML config (Lightning's LightningCLI)",
    "validate": "run validation only (held-out accuracy, pass@k) from the same config",
    "plot": "draw the curves of a run (a CSVLogger directory) into a PNG",
    "export": "write a checkpoint's policy as a Hugging Face model directory (LoRA merged or alone)",
}


class RLPTParser(LightningArgumentParser):
    """The parser of ``fit`` / ``validate``: no prefix matching (argparse's default took
    ``--model.beta`` for ``--model.betas`` and then failed on the value), and a one-line usage
    on errors instead of the hundred-odd lines of every key (``--help`` still lists them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def format_usage(self) -> str:
        return f"usage: {self.prog} [-h] [-c CONFIG] [--print_config] [--KEY VALUE ...]\n"


class RLPTCLI(LightningCLI):
    """``LightningCLI`` with the subcommands an `RLModule` supports (it has no test or predict
    step) and no optimizer keys (`RLModule.configure_optimizers` builds AdamW from its own
    ``lr`` / ``weight_decay`` / ``betas``)."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {k: v for k, v in LightningCLI.subcommands().items() if k in ("fit", "validate")}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightning-rlpt``; returns the exit status.

    Args:
        argv: the arguments after the program name (default ``sys.argv[1:]``).

    Examples:
        >>> main(["plot", "runs/arithmetic-cli", "--out", "curves.png"])  # doctest: +SKIP
        0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "plot":
        return plot_command(argv[1:])
    if argv[0] == "export":
        return export_command(argv[1:])
    if not argv[0].startswith("-") and argv[0] not in COMMANDS:
        print(f"{PROG}: error: unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)}\n\n{usage()}",
              file=sys.stderr)
        return 2
    return lightning_command(argv)


def usage() -> str:
    lines = [f"usage: {PROG} {{{','.join(COMMANDS)}}} ...", "",
             "RL post-training (GRPO family) of Hugging Face causal LMs on a Lightning Trainer.", "", "commands:"]
    lines += [f"  {name:<9} {text}" for name, text in COMMANDS.items()]
    lines += ["", f"`{PROG} COMMAND --help` shows a command's options; docs/cli.md has examples."]
    return "\n".join(lines)


# ---------------------------------------------------------------- fit / validate
def lightning_command(argv: list[str]) -> int:
    """``fit`` / ``validate`` through `RLPTCLI`; each ``--config`` file's directory goes on
    ``sys.path`` first, so its reward functions can be named as ``module:function``."""
    for directory in config_dirs(argv):
        if directory not in sys.path:
            sys.path.insert(0, directory)
    # args=None reads sys.argv itself; passing the same list again makes LightningCLI warn
    args = None if argv == sys.argv[1:] else argv
    RLPTCLI(RLModule, PromptDataModule, auto_configure_optimizers=False, args=args, parser_kwargs={"prog": PROG},
            parser_class=RLPTParser)
    return 0


def config_dirs(argv: Sequence[str]) -> list[str]:
    """Directories of the config files named by ``--config X``, ``--config=X`` or ``-c X``."""
    paths = []
    for i, arg in enumerate(argv):
        if arg in ("-c", "--config") and i + 1 < len(argv):
            paths.append(argv[i + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    return [os.path.dirname(os.path.abspath(p)) for p in paths if os.path.isfile(p)]


# ---------------------------------------------------------------- plot
def plot_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"{PROG} plot", description=COMMANDS["plot"])
    parser.add_argument("run_dir", help="a CSVLogger run directory (metrics.csv in it or in a version_N below)")
    parser.add_argument("--out", help="the PNG to write (default: curves.png beside metrics.csv)")
    args = parser.parse_args(argv)
    from .plotting import plot_metrics

    try:
        csv_path = find_metrics(args.run_dir)
        png = plot_metrics(csv_path, args.out or os.path.join(os.path.dirname(csv_path), "curves.png"))
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    print(f"metrics: {csv_path}\ncurves:  {png}")
    return 0


def find_metrics(run_dir: str) -> str:
    """The ``metrics.csv`` of a run: ``run_dir`` itself, in it, or below it (the newest one
    when several versions exist).

    Examples:
        >>> find_metrics("runs/arithmetic-cli")  # doctest: +SKIP
        'runs/arithmetic-cli/lightning_logs/version_0/metrics.csv'
    """
    if os.path.isfile(run_dir):
        return run_dir
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"no run directory {run_dir!r}: pass the save_dir of a CSVLogger run")
    found = glob.glob(os.path.join(glob.escape(run_dir), "**", "metrics.csv"), recursive=True)
    if not found:
        raise FileNotFoundError(f"no metrics.csv under {run_dir!r}: expected a CSVLogger run directory "
                                "(<save_dir>/<name>/version_N/metrics.csv). Train with a CSVLogger (the example "
                                "config uses one) and pass its save_dir or version directory")
    return max(found, key=os.path.getmtime)


# ---------------------------------------------------------------- export
def export_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"{PROG} export", description=COMMANDS["export"])
    parser.add_argument("ckpt", help="a .ckpt file saved by Lightning while training an RLModule")
    parser.add_argument("out_dir", help="the directory to write (new or empty)")
    parser.add_argument("--adapter-only", action="store_true",
                        help="LoRA/QLoRA: save the adapter alone (peft) instead of merging it into the base")
    parser.add_argument("--model", help="the base model to rebuild on (default: the path recorded in the checkpoint)")
    args = parser.parse_args(argv)
    from ..model.export import export_checkpoint

    try:
        out = export_checkpoint(args.ckpt, args.out_dir, merge_lora=not args.adapter_only, model=args.model)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        parser.error(str(err))
    print(f"exported {'the adapter' if args.adapter_only else 'the model'} of {args.ckpt} to {out}")
    return 0


if __name__ == "__main__":  # python -m lightning_rlpt.cli, where the console script is not installed
    sys.exit(main())
