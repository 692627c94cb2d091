"""Render figures from their JSON (``benchmarks/results/``) into the pages that quote them, between
``<!-- name -->`` markers, with the report scripts' own arithmetic (medians, ratios, the examples'
own report functions): the README's headline results, docs/results.md's demo line, calculator
table and ablation summary, and docs/callbacks.md's ablation table. Never typed by hand: tests/meta/test_results_sources.py fails when a page differs
from what this script renders.

    python benchmarks/headlines.py          # rewrite the pages' blocks
    python benchmarks/headlines.py --check  # exit 1 if one is stale
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the report modules import their neighbours by name
import floor as floors  # noqa: E402
import memory_scaling_report  # noqa: E402
import rollout_throughput_report  # noqa: E402
import parts_before_after  # noqa: E402
import step_before_after  # noqa: E402
import vs_trl_report  # noqa: E402

ROOT, RESULTS = os.path.dirname(HERE), os.path.join(HERE, "results")
README, RESULTS_PAGE = os.path.join(ROOT, "README.md"), os.path.join(ROOT, "docs", "results.md")
AGENTS_EXAMPLE = os.path.join(ROOT, "docs", "agents_example.md")
CALLBACKS_PAGE = os.path.join(ROOT, "docs", "callbacks.md")
KERNELS_PAGE = os.path.join(ROOT, "docs", "kernels.md")


def load(name: str) -> dict:
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def example_module(path: str):
    """An example's report module (no heavy imports), by its path: the examples are not a package."""
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def demo_line() -> str:
    return example_module("examples/arithmetic/demo_report.py").summary(load("demo.json"))


def calculator_table() -> str:
    data = load("tool_calculator.json")
    return example_module("examples/tool_calculator/calculator_report.py").table(data["arms"], data["steps"],
                                                                                  data["held_out"])


def ablations(render: str) -> str:
    """The callback ablations (examples/ablations.py --json): ``table`` or ``summary``."""
    return getattr(example_module("examples/ablations_report.py"), render)(load("ablations.json")) + "\n"


def seed_rollout_table() -> str:
    """The HF engine's per-row sampler beside the one torch stream it replaced (medians of alternating runs)."""
    data = load("hf_default_rollout.json")
    rows = {"before": f"before ({data['before_commit']}): one torch stream", "after": "after: per-row seeds, one call"}
    lines = [f"| HF engine, seed_per_prompt={data['seed_per_prompt']} | generate calls | median s | runs |",
             "|---|---:|---:|---:|"]
    lines += [f"| {name} | 1 | {data['median_s'][side]:.2f} | {len(data['seconds'][side])} |"
              for side, name in rows.items()]
    paired = data["paired_speedups"]
    ratios = f"({data['speedup']:.2f}× faster; paired ratios {min(paired):.2f}–{max(paired):.2f}.)"
    return "\n".join(lines) + f"\n\n{ratios}\n"


def inverse_cdf_line() -> str:
    """The HF engine's rollout with the Gumbel-max sampler (its last commit) and with inverse CDF."""
    data = load("inverse_cdf_rollout.json")
    paired, medians = data["paired_speedups"], data["median_s"]
    return (f"HF engine, one `generate` call of {data['prompts'] * data['group']} rows × {data['new_tokens']} tokens, "
            f"vocabulary 32,000, fp32: Gumbel-max ({data['before_commit']}) {medians['before']:.2f} s, inverse CDF "
            f"{medians['after']:.2f} s, {data['speedup']:.2f}× as fast (paired ratios {min(paired):.2f}–{max(paired):.2f}; "
            f"medians of {len(data['seconds']['after'])} alternating runs each in its own process, {data['measured']}, "
            f"`{data['command']}`).\n")


def demo() -> str:
    data, held_out = load("demo.json"), example_module("examples/arithmetic/demo_report.py").HELD_OUT
    return (f"- The demo: held-out accuracy {data['before']:.1%} → {data['after']:.1%} after {data['steps']} GRPO "
            f"steps ({data['seconds']:.0f} s), {held_out} unseen sums.").replace("%", " %")


def calculator() -> str:
    tools, bare = (load("tool_calculator.json")["arms"][a] for a in ("tools", "no_tools"))
    return (f"- Tool calling: with a `multiply` tool a 2-layer model reaches {tools['accuracy_after']:.1%} on 3-digit "
            f"products, {bare['accuracy_after']:.0%} without.").replace("%", " %")


def peak(precision: str, cpu: str, figure: str) -> float:
    """floor.json's matrix-product peak at ``precision``, for a ``figure`` measured on ``cpu``: a ratio
    to the floor needs both from one host (a VM's CPU can change between sessions), so another is refused."""
    data = load("floor.json")
    if cpu != data["machine"]["cpu_model"]:
        raise SystemExit(f"{figure} was measured on {cpu!r}, floor.json's peaks on {data['machine']['cpu_model']!r}: "
                         f"a ratio to the floor needs both from one host; run `python benchmarks/floor.py --measure` on "
                         f"the host of the figure (or measure the figure again where the peaks were)")
    return data["peaks"][f"cpu_{precision}"]["flop_per_s"]


def against_trl() -> str:
    """Like for like at vocabulary 32,000: TRL's median step over our HF engine's, and peak RSS."""
    phase = load("vs_trl.json")["throughput_vocab32k"]
    runs = phase["runs"]
    step = like_for_like_steps(runs)
    rss = {e: max(r["peak_rss_mb"] for r in runs if r["engine"] == e) for e in ("trl", "hf")}
    floor = floors.ratio_to_floor(step["hf"], floors.reference_step(), peak("fp32", phase["cpu"], "vs_trl.json's fp32 step"))
    line = (f"- Against TRL 1.16, like for like (both on `transformers.generate`, vocabulary 32,000): a step\n"
            f"  {step['trl'] / step['hf']:.2f}× faster than `GRPOTrainer`'s, at {rss['hf']:,.0f} MB peak RSS against "
            f"{rss['trl']:,.0f} MB; {floor:.1f}× the step's fp32 matrix-product floor.")
    return line + bf16_pair()


def like_for_like_steps(runs: list[dict]) -> dict[str, float]:
    """TRL's and our HF engine's median steps over a phase's runs."""
    return {e: vs_trl_report._median([r for r in runs if r["engine"] == e], "median_step_s") for e in ("trl", "hf")}


def bf16_pair() -> str:
    """The same comparison with both sides under bf16 autocast, where it was measured."""
    results = load("vs_trl.json")
    if "throughput_vocab32k_bf16" not in results:
        return ""
    phase = results["throughput_vocab32k_bf16"]
    step = like_for_like_steps(phase["runs"])
    floor = floors.ratio_to_floor(step["hf"], floors.reference_step(), peak("bf16", phase["cpu"], "vs_trl.json's bf16 step"))
    return (f"\n  In bf16 (TRL `bf16=True`, ours `precision=\"bf16-mixed\"`): {step['trl'] / step['hf']:.2f}× faster; "
            f"{floor:.1f}× the bf16 floor.")


def memory() -> str:
    """Peak RSS growth when the rollout grows (no gradient checkpointing), micro-batched and one pass."""
    data = load(os.path.join("memory_scaling_80k", "memory_scaling.json"))
    peak = {g["path"]: g["peak"] for g in memory_scaling_report.growth(data) if not g["ckpt"]}
    sizes = data["sizes"].split(",")
    grow = int(sizes[-1].split("x")[1]) // int(sizes[0].split("x")[1])
    return (f"- Memory: a {grow}× larger rollout raises the micro-batched step's peak {peak['micro']:.2f}× "
            f"(one pass: {peak['one-pass']:.2f}×).")


def kernel() -> str:
    """The fused path in the module's training step, fp32, against the plain path."""
    rows = load("logprob_kernel.json")["rows"]
    row = next(r for r in rows if r["dtype"] == "float32" and r["variant"] == "fused-train")
    return (f"- The fused log-prob kernel: {row['time_ratio']:.2f}× the time of the plain path with "
            f"{100 * row['mem_ratio']:.1f} % of its extra memory (fp32).")


def floor_line() -> str:
    data = load("floor.json")
    peak = data["peaks"]["cpu_fp32"]
    seconds = floors.floor(floors.reference_step(), peak["flop_per_s"])["seconds"]["step"]
    return (f"- The floor: this CPU multiplies matrices at {peak['gflops']:.0f} GFLOP/s (fp32), so the matrix products "
            f"of the\n  TRL comparison's step alone take {seconds:.2f} s ([the floors](docs/results.md#floors)).")


def floor_table() -> str:
    data = load("floor.json")
    measured = [f"{name}: {p['gflops']:.0f} GFLOP/s" if "gflops" in p else f"{name}: not measured ({p['skipped']})"
                for name, p in data["peaks"].items()]
    return (f"Peaks ({data['date'][:10]}, `torch.mm` {next(iter(data['peaks'].values())).get('m', '?')}³, median): "
            + "; ".join(measured) + ".\n\n" + floors.report(floors.reference_step(), data["peaks"]) + "\n")


def floor_ratios() -> str:
    """Each side of the TRL comparison (vocabulary 32,000) over the floor of its step at its own
    precision's peak (fp32; bf16 where the bf16 pair was measured): the median step of
    vs_trl.json over floor.json's peak, at render time, so neither can drift."""
    data, results = load("floor.json"), load("vs_trl.json")
    shape = floors.reference_step()
    lines = ["| engine | precision | median step (s) | × floor at that precision's peak |", "|---|---|---:|---:|"]
    dates = []
    for precision, key in (("fp32", "throughput_vocab32k"), ("bf16", "throughput_vocab32k_bf16")):
        if key not in results or f"cpu_{precision}" not in data["peaks"]:
            continue
        runs = results[key]
        top = peak(precision, runs["cpu"], f"vs_trl.json's {key}")
        dates.append(f"{precision} {runs['date'][:10]}")
        for engine in vs_trl_report.ORDER:
            rs = [r for r in runs["runs"] if r["engine"] == engine]
            if rs:
                step = vs_trl_report._median(rs, "median_step_s")
                lines.append(f"| {vs_trl_report.NAMES[engine]} | {precision} | {step:.2f} | "
                             f"{floors.ratio_to_floor(step, shape, top):.1f} |")
    return (f"Measured against it (the steps of [Against TRL](#against-trl), {', '.join(dates)}; the "
            f"peaks {data['date'][:10]}):\n\n" + "\n".join(lines) + "\n")


def head_gradient_table() -> str:
    """`benchmarks/head_gradient.py`: the update's head, forward-pass gradient against recompute."""
    data = load("head_gradient.json")
    shape, sides = data["shape"], data["sides"]
    lines = ["| head gradient | median (s) | × floor (3 GEMMs) | extra memory (MiB) |", "|---|---:|---:|---:|"]
    for side in ("forward", "recompute"):
        r = sides[side]
        ratio = "—" if r["floor_ratio"] is None else f"{r['floor_ratio']:.2f}"
        lines.append(f"| `{side}` | {r['seconds']:.3f} | {ratio} | {r['extra_mb']:.0f} |")
    return (f"{shape['rows']} rows × {shape['completion']} tokens, hidden {shape['hidden']}, vocabulary "
            f"{shape['vocab']:,}, fp32, {data['threads']} threads ({data['date'][:10]}; "
            f"`python benchmarks/head_gradient.py`): the forward-pass path is {data['speedup']:.2f}× as fast.\n\n"
            + "\n".join(lines) + "\n")


def rollout_profile_table() -> str:
    """`benchmarks/rollout_profile.py`: each engine's rollout against its floor, and its parts."""
    data = load("rollout_profile.json")
    # the floor at render time, from floor.json's peak on the same host, as floor_ratios does
    top = peak("fp32", data["machine"]["model"], "rollout_profile.json")
    floor_s = floors.floor(floors.reference_step(), top)["seconds"]["rollout"]
    engines = data["engines"]
    names = {"hf": "HF engine", "vllm": "`VLLMEngine`"}
    lines = [f"Measured {data['date'][:10]} (`python benchmarks/rollout_profile.py`): 16 prompts × 8 completions × "
             f"32 tokens, fp32; the rollout's floor {floor_s:.2f} s.", "",
             "| engine | median rollout (s) | × rollout floor |", "|---|---:|---:|"]
    lines += [f"| {names[e]} | {r['seconds']:.2f} | {r['seconds'] / floor_s:.1f} |" for e, r in engines.items()]
    for e, r in engines.items():
        lines += ["", f"{names[e]}, shares of one profiled call:", "", "| part | share |", "|---|---:|"]
        lines += [f"| {part} | {100 * share:.0f} % |" for part, share in r["shares"].items()]
    return "\n".join(lines) + "\n"


def step_before_after_block() -> str:
    """`benchmarks/step_before_after.py`: the step at a commit and now, each side's ratios to the
    floor at the fp32 peak measured in the same invocation (so on the same host)."""
    data = load("step_before_after.json")
    peak, floor_s = max(data["fp32_peak_gflops"]), step_before_after.floors(data)
    return (f"Measured {data['measured']} on {data['cpu']} ({data['cpus']} cores; fp32 peak {peak:.0f} GFLOP/s, the "
            f"higher of two readings in this invocation; floors: step {floor_s['step']:.2f} s, rollout "
            f"{floor_s['rollout']:.2f} s, update {floor_s['update']:.2f} s), medians of {data['reps']} alternating "
            f"runs per side, each its own "
            f"process, of {data['steps'] - 1} steps after the first (`{data['command']}`):\n\n"
            + step_before_after.table(data) + "\n")


def parts_before_after_block() -> str:
    """`benchmarks/parts_before_after.py`: the changed parts of the step, both versions in one process."""
    data = load("parts_before_after.json")
    return (f"Measured {data['measured']} on {data['cpu']} ({data['cpus']} cores, {data['threads']} threads), "
            f"{data['rounds']} alternating rounds, each the median of {data['reps']} calls per version "
            f"(`{data['command']}`):\n\n" + parts_before_after.table(data) + "\n")


def vs_trl_block(phase: str):
    """Renders one throughput phase of vs_trl.json: its table and how it was measured."""
    return lambda: vs_trl_report.throughput_section(load("vs_trl.json")[phase])


def headlines() -> str:
    return "\n".join([demo(), calculator(), against_trl(), memory(), kernel(), floor_line()]) + "\n"


# page -> marker name -> what renders the block between <!-- name --> and <!-- /name -->
BLOCKS = {README: {"headlines": headlines},
          RESULTS_PAGE: {"demo": lambda: f"```\n{demo_line()}\n```\n",
                         "calculator": lambda: f"```\n{calculator_table()}\n```\n",
                         "seed-rollout": seed_rollout_table, "floor": floor_table, "floor-ratios": floor_ratios,
                         "rollout-profile": rollout_profile_table, "inverse-cdf": inverse_cdf_line,
                         "step-before-after": step_before_after_block, "parts-before-after": parts_before_after_block,
                         "engines": lambda: rollout_throughput_report.table(load("rollout_throughput.json")),
                         "ablations": lambda: ablations("summary"),
                         **{f"vs-trl-{key.replace('_', '-')}": vs_trl_block(f"throughput_{key}")
                            for key in ("vocab32k", "vocab32k_bf16", "small")}},
          CALLBACKS_PAGE: {"ablations": lambda: ablations("table")},
          KERNELS_PAGE: {"head-gradient": head_gradient_table},
          AGENTS_EXAMPLE: {"calculator": lambda: f"```\n{calculator_table()}\n```\n"}}


def rendered(page: str, text: str) -> str:
    for name, render in BLOCKS[page].items():
        mark = re.compile(rf"(<!-- {name} -->\n).*?(<!-- /{name} -->)", re.S)
        if not mark.search(text):
            raise SystemExit(f"{page}: no <!-- {name} --> markers")
        text = mark.sub(lambda m: m.group(1) + render() + m.group(2), text)
    return text


def main(argv: list[str]) -> int:
    stale = []
    for page in BLOCKS:
        text = open(page, encoding="utf-8").read()
        new = rendered(page, text)
        if new != text and "--check" in argv:
            stale.append(page)
        elif new != text:
            open(page, "w", encoding="utf-8").write(new)
    if stale:
        print(f"{', '.join(stale)}: figures differ from their JSON; run python benchmarks/headlines.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
