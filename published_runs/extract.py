"""Build `rows.csv`: every row of NeMo RL's published performance summary (three releases), with
what its recipe says that the table leaves out.

    python published_runs/extract.py --summaries DIR --nemo-rl CHECKOUT

DIR holds the three releases of `docs/about/performance-summary.md` (named
`performance-summary_<commit>_v<release>.md`); CHECKOUT is a clone of github.com/NVIDIA-NeMo/RL
with those commits. For each row the recipe is
`examples/configs/recipes/llm/performance/<algo>-<model>-<nodes>n<gpus per node>g[-fp8][-async-<k>off].yaml`
at the release's commit, read with its `defaults:` chain. The table's own figures (GPUs, batch
sizes, generation TP, training layout, lengths, step time) win where a recipe at that commit
differs; the recipe gives samples per prompt, `max_new_tokens`, the generation/training GPU split
of off-policy rows, vLLM's `gpu_memory_utilization` and the KL penalty (a reference model's
log-probs every step when it is above 0). Each row's prompt length is what its own
figures imply: tokens/s/GPU x step time x GPUs / samples per step, less the average generated
length (NeMo RL's `mean_gen_tokens_per_sample`, which counts the response only).

Rows rlsim cannot express are kept, with the reason. The fit/test split is by configuration
(model, system, precision, policy, GPUs: one configuration measured in several releases stays in
one half): within each model, configurations sorted by name alternate fit, test, fit, ... The
configurations that generation across nodes made expressible later (`added`) alternate among
themselves the same way, and the first split's configurations keep their half.

    python published_runs/extract.py --update    # re-annotate rows.csv, no checkout
"""

from __future__ import annotations

import argparse
import csv
import posixpath
import re
import subprocess
from pathlib import Path

import yaml

MODELS = {"LLAMA3.1_8B": ("llama3.1-8b-instruct", "llama-3.1-8b"), "DeepSeek V3": ("deepseek-v3", "deepseek-v3"),
          "Qwen3-235B": ("qwen3-235b", "qwen3-235b-a22b"), "Qwen3-30B3A": ("qwen3-30ba3b", "qwen3-30b-a3b"),
          "Qwen3-32B": ("qwen3-32b", "qwen3-32b"), "Nemotron-3-Nano-30B-A3B": ("nemotron-3-nano", "")}  # fmt: skip
SYSTEMS = {"DGX-H100": ("h100", 8), "GB200-NVL72": ("gb200", 4)}
RECIPES = "examples/configs/recipes/llm/performance"


def _show(repo: Path, commit: str, path: str) -> str | None:
    out = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def recipe(repo: Path, commit: str, path: str) -> dict | None:
    text = _show(repo, commit, path)
    if text is None:
        return None
    raw = yaml.safe_load(text)
    parent = raw.pop("defaults", None)
    if parent:
        raw = _merge(recipe(repo, commit, posixpath.normpath(posixpath.join(posixpath.dirname(path), parent))), raw)
    return raw


def _get(d: dict, *keys: str):  # noqa: ANN202
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _num(text: str) -> float:
    return float(text.replace(",", "").strip())


def rows_of(summary: Path) -> list[dict]:
    release = re.search(r"_v([\d.]+)\.md$", summary.name).group(1)
    commit = summary.name.split("_")[1]
    out, system, precision = [], None, None
    for line in summary.read_text().splitlines():
        if line.startswith("* System:"):
            system = line.split(":", 1)[1].strip()
        if line.startswith("* Precision:"):
            precision = "fp8" if "Generation FP8" in line else "bf16"
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        header = cells[0] in ("Algorithm", "Model") or cells[0].startswith("-")
        if not line.startswith("|") or len(cells) < 11 or header:
            continue
        if len(cells) == 11:  # v0.4 has no algorithm column
            cells = ["GRPO", *cells]
        algo, model, policy, tmax, avg, gpus, ggbs, tgbs, gen, train, tps, step = cells[:12]
        out.append({"release": release, "commit": commit, "system": system, "precision": precision,
                    "algorithm": algo, "model": model, "policy": policy, "max_seq_len": int(_num(tmax)),
                    "avg_gen_len": _num(avg), "gpus": int(_num(gpus)), "g_gbs": int(_num(ggbs)),
                    "t_gbs": int(_num(tgbs)), "gen_tp_pp": gen, "train_layout": train,
                    "tokens_per_s_per_gpu": _num(tps), "step_s": _num(step)})  # fmt: skip
    return out


def annotate(row: dict, repo: Path) -> dict:
    short, rlsim_model = MODELS.get(row["model"], ("", ""))
    gpu, per_node = SYSTEMS[row["system"]]
    nodes = row["gpus"] // per_node
    off = re.match(r"(\d+)-step Off", row["policy"])
    name = f"{row['algorithm'].lower()}-{short}-{nodes}n{per_node}g" + ("-fp8" if row["precision"] == "fp8" else "")
    name += f"-async-{off.group(1)}off" if off else ""
    path = f"{RECIPES}/{name}.yaml"
    cfg = recipe(repo, row["commit"], path) or {}
    gen = _get(cfg, "policy", "generation") or {}
    gen_tp = int(re.findall(r"\d+", row["gen_tp_pp"])[0])
    layout = [x.strip() for x in row["train_layout"].strip("[]").split(",")]
    mc = _get(cfg, "policy", "megatron_cfg") or {}
    gen_gpus = row["gpus"]
    if off and _get(gen, "colocated", "enabled") is False:
        res = _get(gen, "colocated", "resources") or {}
        gen_gpus = int(res.get("num_nodes") or 0) * int(res.get("gpus_per_node") or per_node)
    prompt = row["tokens_per_s_per_gpu"] * row["step_s"] * row["gpus"] / row["g_gbs"] - row["avg_gen_len"]
    tp, cp, ep = (int(x) for x in layout[:3])
    pp = int(layout[3]) if len(layout) <= 5 else int(mc.get("pipeline_model_parallel_size") or 1)
    train_gpus = row["gpus"] - gen_gpus if gen_gpus < row["gpus"] else row["gpus"]
    source = "table"
    if train_gpus % (tp * cp * pp) or (train_gpus // pp) % ep:  # the table's layout cannot run there: the recipe's
        tp, cp, ep, pp = (int(mc.get(k) or 1) for k in ("tensor_model_parallel_size", "context_parallel_size",
                                                         "expert_model_parallel_size", "pipeline_model_parallel_size"))
        source = "recipe (the table's does not divide the training GPUs)"
    prompts = _get(cfg, "grpo", "num_prompts_per_step") or ""
    samples = _get(cfg, "grpo", "num_generations_per_prompt") or ""
    dynamic = bool(_get(cfg, "grpo", "use_dynamic_sampling"))
    generated = int(prompts) * int(samples) if prompts and samples else row["g_gbs"]
    reason = reason_of(rlsim_model, row["algorithm"], row["policy"], bool(cfg), f"{name}.yaml", row["commit"],
                       generated, row["t_gbs"], dynamic)  # fmt: skip
    vpp = layout[4] if len(layout) > 4 and layout[4].isdigit() else ""
    return row | {
        "rlsim_model": rlsim_model, "gpu": gpu, "recipe": path if cfg else "", "gen_tp": gen_tp,
        "samples_per_prompt": _get(cfg, "grpo", "num_generations_per_prompt") or "",
        "max_new_tokens": new if isinstance(new := gen.get("max_new_tokens"), int) else row["max_seq_len"],
        "gen_gpus": gen_gpus, "gpu_memory_utilization": _get(gen, "vllm_cfg", "gpu_memory_utilization") or "",
        "train_tp": tp, "train_cp": cp, "train_ep": ep, "train_pp": pp, "layout_source": source,
        "kl_penalty": _get(cfg, "loss_fn", "reference_policy_kl_penalty") or 0.0,
        "prompt_tokens": round(max(prompt, 0.0)), "expressible": not reason, "reason": reason,
        "config": f"{row['model']}|{gpu}|{row['precision']}|{row['policy']}|{row['gpus']}",
        "num_prompts_per_step": prompts, "dynamic_sampling": dynamic, "train_vpp": vpp,
        "recompute": "full" if _get(mc, "activation_checkpointing") else "none",
        "enforce_eager": bool(_get(gen, "vllm_cfg", "enforce_eager")),
        "optimizer_offload_fraction": (_get(mc, "optimizer", "optimizer_offload_fraction") or 0.0)
        if _get(mc, "optimizer", "optimizer_cpu_offload") else 0.0,
    }  # fmt: skip


def reason_of(
    rlsim_model: str,
    algorithm: str,
    policy: str,
    recipe_found: bool,
    recipe: str,
    commit: str,
    generated: int = 0,
    trained: int = 0,
    dynamic: bool = False,
) -> str:
    """Why rlsim cannot express a row ("" where it can). Generation TP beyond the scale-up domain
    and generation with pipeline stages are expressible since rlsim derives them
    (`rlsim.derive.derive`; no published row uses pipeline stages to generate)."""
    off = re.match(r"(\d+)-step Off", policy)
    if not rlsim_model:
        return "hybrid Mamba model (Nemotron): out of scope"
    if algorithm == "SWE":
        return "agentic multi-turn SWE rollouts: the agentic issue"
    if off and int(off.group(1)) > 1:
        return f"{off.group(1)}-step off-policy: predicted apart as k_step_off (outside the fit and its halves)"
    if not recipe_found:
        return f"recipe {recipe} not found at {commit}"
    if dynamic and generated != trained:
        return (
            f"DAPO's dynamic sampling generates {generated} samples a batch for a {trained}-sample training batch: "
            "how many batches a step takes depends on the run's rewards, which are not published"
        )
    return ""


def split(rows: list[dict], committed: dict[str, tuple[str, str]]) -> None:
    """Each expressible configuration's half. A configuration already in `committed` (the file's
    split, as committed before any fit) keeps its half and its mark; the others alternate fit,
    test, fit, ... within each model among themselves, sorted by name. The first split had no
    mark; the configurations that generation across nodes made expressible are marked `added`, so
    that their test half is reported apart."""
    by_model: dict[str, list[str]] = {}
    for r in rows:
        if r["expressible"] and r["config"] not in committed:
            by_model.setdefault(r["model"], [])
            if r["config"] not in by_model[r["model"]]:
                by_model[r["model"]].append(r["config"])
    new = {c: ("fit", "test")[i % 2] for configs in by_model.values() for i, c in enumerate(sorted(configs))}
    for r in rows:
        half, added = committed.get(r["config"], (new.get(r["config"], ""), "generation across nodes"))
        r["half"] = half if r["expressible"] else ""
        r["added"] = added if r["half"] else ""


def committed_halves(path: Path) -> dict[str, tuple[str, str]]:
    """The committed split: each configuration's half and mark."""
    if not path.exists():
        return {}
    with path.open(newline="") as f:
        return {r["config"]: (r["half"], r.get("added", "")) for r in csv.DictReader(f) if r["half"]}


def update(path: Path) -> list[dict]:
    """The committed rows re-annotated by today's rules, without a NeMo RL checkout: each row's
    reason from its recorded fields, then the split."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    halves = committed_halves(path)
    for r in rows:
        prompts, samples = r.get("num_prompts_per_step") or "", r.get("samples_per_prompt") or ""
        generated = int(float(prompts)) * int(float(samples)) if prompts and samples else int(r["g_gbs"])
        r["reason"] = reason_of(r["rlsim_model"], r["algorithm"], r["policy"], bool(r["recipe"]),
                                r["recipe"], r["commit"], generated, int(r["t_gbs"]),
                                r.get("dynamic_sampling") == "True")  # fmt: skip
        r["expressible"] = not r["reason"]
    split(rows, halves)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summaries", type=Path)
    ap.add_argument("--nemo-rl", type=Path)
    ap.add_argument("--update", action="store_true", help="Re-annotate the committed rows by today's rules.")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("rows.csv"))
    a = ap.parse_args()
    if a.update:
        rows = update(a.out)
    else:
        if a.summaries is None or a.nemo_rl is None:
            ap.error("--summaries and --nemo-rl are required unless --update")
        rows = [r for s in sorted(a.summaries.glob("performance-summary_*.md")) for r in rows_of(s)]
        for r in rows:  # the page's HEAD at download time, as a commit
            rev = ["git", "-C", str(a.nemo_rl), "rev-parse", "--short=9", r["commit"]]
            r["commit"] = subprocess.run(rev, capture_output=True, text=True, check=True).stdout.strip()
        rows = [annotate(r, a.nemo_rl) for r in rows]
        split(rows, committed_halves(a.out))
    with a.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows)} rows, {sum(r['expressible'] for r in rows)} expressible -> {a.out}")


if __name__ == "__main__":
    main()
