"""The report of `benchmarks/gpu_check.py`: the short table printed last, and the Markdown with one
section per part, both built from the results JSON alone (so a partial run renders too)."""
from __future__ import annotations

import math

STATUS = {"ok": "ok", "failed": "**FAILED**", "timeout": "**TIMEOUT**", "skipped": "skipped"}


def _fmt(x, spec: str = ".1e") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return format(x, spec)


def _cases(result: dict) -> list[dict]:
    """Records that measured something (not skips, not errors)."""
    return [r for r in result["records"] if "case" in r and "skipped" not in r and "error" not in r]


def _worst(r: dict) -> float:
    return max(r[k] for k in ("logp", "entropy", "d_hidden", "d_weight") if r.get(k) is not None)


def _accuracy_summary(result: dict) -> str:
    parts = []
    for dtype in ("float32", "bfloat16"):
        fused = [_worst(r) for r in _cases(result) if r["dtype"] == dtype and r["candidate"].startswith("fused")]
        plain = [_worst(r) for r in _cases(result) if r["dtype"] == dtype and r["candidate"] == "plain"]
        if fused:
            parts.append(f"{dtype}: fused ≤ {max(fused):.1e} (plain {_fmt(max(plain) if plain else None)})")
    return "worst relative error: " + "; ".join(parts) if parts else ""


def _largest(result: dict) -> list[dict]:
    """The speed records of the largest bf16 case (else the largest case)."""
    cases = _cases(result)
    if not cases:
        return []
    key = lambda r: (r["dtype"] == "bfloat16", r["n"] * r["h"] * r["v"])  # noqa: E731
    best = max(key(r) for r in cases)
    return [r for r in cases if key(r) == best]


def _speed_summary(result: dict) -> str:
    rows = _largest(result)
    if not rows:
        return ""
    r0, by = rows[0], {r["candidate"]: r for r in rows}
    fused = min((r for r in rows if r["candidate"].startswith("fused")), key=lambda r: r["ms"], default=None)
    shown = [by.get("plain"), fused, by.get("liger")]
    mem = lambda r: "" if r.get("extra_mb") is None else f"/{r['extra_mb'] / 1024:.2f} GiB"  # noqa: E731
    return (f"N {r0['n']} H {r0['h']} V {r0['v']} {r0['dtype']}: " +
            ", ".join(f"{r['candidate']} {r['ms']:.1f} ms{mem(r)}" for r in shown if r))


def _grpo_summary(result: dict, data: dict) -> str:
    rows = _cases(result)
    if not rows:
        return ""
    r = rows[-1]
    text = f"{r['median_step_s']:.2f} s/step (rollout {r['rollout_s']:.2f} s), {r['tokens_per_step']:.0f} tokens/step"
    if result["part"] == "grpo_trl":
        ours = next((_cases(p) for p in data["parts"] if p["part"] == "grpo_ours" and _cases(p)), None)
        if ours:
            text += f"; lightning-rlpt {r['median_step_s'] / ours[-1]['median_step_s']:.2f}× TRL's speed"
    return text


def _smoke_summary(result: dict) -> str:
    rows = _cases(result)
    if not rows:
        return ""
    r = rows[-1]
    if "before" in r:
        return f"held-out accuracy {r['before']:.1%} → {r['after']:.1%} in {r['steps']} steps"
    if "rel" in r:
        return f"max gradient difference {r['rel']:.1e} of the largest (tolerance {r['tolerance']:.0e})"
    if "dtensor_params" in r:
        return f"{r['steps']} steps, {r['dtensor_params']} DTensor parameters"
    if "adapters_max_change" in r:
        return f"{r['steps']} steps, params {'/'.join(r['param_dtypes'])}, KL {r['kl']}"
    return f"{r.get('steps', '?')} steps on {r.get('engine', '?')}"


def summary(result: dict, data: dict) -> str:
    """One line of what a part found (its reason when it did not finish)."""
    name = result["part"]
    if name == "kernel_accuracy":
        text = _accuracy_summary(result)
    elif name == "kernel_speed":
        text = _speed_summary(result)
    elif name.startswith("grpo"):
        text = _grpo_summary(result, data)
    else:
        text = _smoke_summary(result)
    if result["status"] != "ok":
        text = f"{result.get('reason', '')}" + (f" (so far: {text})" if text else "")
    return text.replace("|", "/")


def table(data: dict) -> str:
    lines = [f"gpu_check on {data['device']} ({data['timer']})", "| part | status | s | result |", "|---|---|---:|---|"]
    for r in data["parts"]:
        lines.append(f"| {r['part']} | {STATUS[r['status']]} | {r['seconds']:.0f} | {summary(r, data)} |")
    return "\n".join(lines)


def _accuracy_table(result: dict) -> str:
    lines = ["| H × V | N | dtype | candidate | log-probs | entropy | d hidden | d weight | gradient through |",
             "|---|---:|---|---|---:|---:|---:|---:|---|"]
    for r in _cases(result):
        lines.append(f"| {r['h']} × {r['v']} | {r['n']} | {r['dtype']} | {r['candidate']} | {_fmt(r['logp'])} | "
                     f"{_fmt(r['entropy'])} | {_fmt(r['d_hidden'])} | {_fmt(r['d_weight'])} | {r['grad_through']} |")
    return "\n".join(lines)


def _speed_table(result: dict) -> str:
    lines = ["| N × H × V | dtype | candidate | fwd+bwd (ms, median) | × plain time | extra peak (MiB) | "
             "× plain memory | first step (ms) | repeats |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    cases = _cases(result)
    for r in cases:
        plain = next((p for p in cases if p["candidate"] == "plain" and
                      (p["n"], p["h"], p["v"], p["dtype"]) == (r["n"], r["h"], r["v"], r["dtype"])), None)
        t_ratio = r["ms"] / plain["ms"] if plain else None
        m_ratio = r["extra_mb"] / plain["extra_mb"] if plain and plain.get("extra_mb") and r.get("extra_mb") is not None \
            else None
        chosen = f" (chose {r['chosen']})" if r.get("chosen") else ""
        lines.append(f"| {r['n']} × {r['h']} × {r['v']} | {r['dtype']} | {r['candidate']}{chosen} | {r['ms']:.2f} | "
                     f"{_fmt(t_ratio, '.2f')} | {_fmt(r.get('extra_mb'), '.0f')} | {_fmt(m_ratio, '.3f')} | "
                     f"{r['first_ms']:.0f} | {len(r['times_ms'])} |")
    return "\n".join(lines)


def _grpo_table(data: dict) -> str:
    rows = [r for p in data["parts"] if p["part"].startswith("grpo") for r in _cases(p)]
    if not rows:
        return "No GRPO side finished."
    trl = next((r for r in rows if r["case"].startswith("TRL")), None)
    lines = ["| side | steps | median step (s) | × TRL | rollout (s) | tokens / step | start-up (s) | peak CUDA (MiB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        speed = _fmt(trl["median_step_s"] / r["median_step_s"], ".2f") if trl else "—"
        lines.append(f"| {r['case']} | {r['steps']} | {r['median_step_s']:.3f} | {speed} | {r['rollout_s']:.3f} | "
                     f"{r['tokens_per_step']:.0f} | {r['startup_s']:.1f} | {_fmt(r['peak_gpu_mb'], '.0f')} |")
    s = rows[0]["shape"]
    return "\n".join(lines) + (f"\n\nModel: {s['layers']} layers × {s['hidden']}, vocabulary {s['vocab']}, random init; "
                               f"{rows[0]['prompts']} prompts × {rows[0]['group']} completions × ≤ "
                               f"{rows[0]['max_new_tokens']} new tokens per step; median over the steps after the first.")


def _records(result: dict) -> str:
    rows = [r for r in result["records"] if "case" in r]
    return "\n".join(f"- `{r['case']}`: " + ", ".join(f"{k}={v}" for k, v in r.items() if k != "case") for r in rows)


def markdown(data: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in data["versions"].items() if v)
    out = [f"# gpu_check ({'dry run, CPU' if data['dry_run'] else data['device']})", "",
           f"{data['date']}; {versions}; timer: {data['timer']}; budget {data['budget_s']:.0f} s.", "", table(data)]
    done = {p["part"] for p in data["parts"]}
    for r in data["parts"]:
        out += ["", f"## {r['part']}: {r['what']}", "", f"Status: {r['status']} ({r['seconds']} s)"
                + (f" — {r['reason']}" if r.get("reason") else "") + ".", ""]
        if r["part"] == "kernel_accuracy" and _cases(r):
            out.append(_accuracy_table(r))
        elif r["part"] == "kernel_speed" and _cases(r):
            out.append(_speed_table(r))
        elif r["part"] == "grpo_trl" or (r["part"] == "grpo_ours" and "grpo_trl" not in done):
            out.append(_grpo_table(data))
        else:
            out.append(_records(r))
        if r.get("log_tail") and r["status"] != "ok":
            out += ["", "<details><summary>log tail</summary>", "", "```", r["log_tail"][-1500:], "```", "", "</details>"]
    return "\n".join(out) + "\n"
