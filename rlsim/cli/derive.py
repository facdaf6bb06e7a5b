"""`rlsim profile derive` and `--model/--gpu/--tp` on the simulating commands: a profile from a
model's config and a GPU's datasheet (`rlsim.derive`), written where every `--profile` reads it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import typer
from rich.table import Table

from rlsim.cli.options import refuse_overwrite
from rlsim.cli.ui import console as make_console
from rlsim.config import EngineConfig
from rlsim.errors import RlsimError
from rlsim.paths import cache_dir

MODEL = typer.Option(
    None, help="Derive the profile: a model name (rlsim profile list), a config.json or its directory."
)
GPU = typer.Option(None, help="With --model: a GPU name (rlsim profile list) or a JSON file of its datasheet facts.")
TP = typer.Option(1, "--tp", help="With --model: tensor-parallel size of each rollout instance.")
EP = typer.Option(1, "--ep", help="With --model: expert-parallel size (1, or --tp for vLLM's enable_expert_parallel).")
DP = typer.Option(
    1, "--dp", help="Data-parallel attention ranks stepping in lockstep (vLLM's data_parallel_size with "
    "enable_expert_parallel; an MoE model, --ep = --dp x --tp); each rank is one instance of --tp GPUs.",
)
PP = typer.Option(
    1, "--pp", help="With --model: pipeline stages of each rollout instance (vLLM's pipeline_parallel_size; the "
    "instance takes TP x PP GPUs, its stages across nodes where they must be).",
)
DTYPE = typer.Option("bf16", "--dtype", help="With --model: weights and KV cache in bf16 or fp8.")
TERMS = typer.Option(
    None, "--terms", help="With --model: framework terms fitted to published runs laid over the derivation: nemo-rl "
    "(fitted on half of NeMo RL's published step times) or a JSON file of them.",
)
TRAINER = typer.Option(
    "fsdp2",
    "--trainer",
    help="With --model: the trainer backend and layout, fsdp2 (veRL's FSDP: 31.8% MFU, "
    "TorchTitan's published run) or megatron (47%, Megatron-LM's); settings in brackets: megatron(tp=2,pp=4,ep=8,"
    "cp=2,mfu=0.4).",
)


def derived_profile_path(
    model: str, gpu: str, tp: int, ep: int = 1, dtype: str = "bf16", trainer: str = "fsdp2", terms: str | None = None,
    pp: int = 1,
    dp: int = 1,
    gpu_memory_utilization: float | None = None,
    kv_cache_dtype: str | None = None,
) -> str:
    """Derive the profile and write it under ~/.cache/rlsim/profiles (or $RLSIM_CACHE_DIR); its path.
    The folder is keyed by everything the profile's name leaves out (the model's config, the GPU's
    facts, the trainer, the terms, the memory fraction and a KV cache dtype other than the
    weights'), so that two runs deriving the same name with other settings never read each
    other's file; the TPs of one setting lie side by side, as `rlsim plan` finds them.
    `gpu_memory_utilization`: the run's (None: veRL's 0.5), so that the weights are held against
    the memory the run gives vLLM, not against the default's; `kv_cache_dtype`: the KV cache's
    (None: `dtype`'s)."""
    from rlsim.derive.derive import derive_profile, setup
    from rlsim.derive.terms import load_terms
    from rlsim.derive.train import Trainer
    from rlsim.files import atomic_write_text

    s, parsed = setup(model, gpu, tp, ep, dtype, kv_cache_dtype, pp=pp, dp=dp), Trainer.parse(trainer)
    raw = derive_profile(s, EngineConfig(gpu_memory_utilization=gpu_memory_utilization), parsed)
    fitted = None
    if terms:
        fitted, _ = load_terms(terms)
        raw = lay_terms(raw, terms)
    key = json.dumps(
        [repr(s.model), repr(s.gpu), repr(parsed), repr(fitted)]
        + ([gpu_memory_utilization] if gpu_memory_utilization is not None else [])
        + ([s.kv_cache_dtype] if s.kv_cache_dtype != s.dtype else [])
    )
    root = cache_dir() / "profiles"
    folder = root / hashlib.sha256(key.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{raw['name']}.json"
    atomic_write_text(path, json.dumps(raw, indent=2) + "\n")
    return str(path)


def lay_terms(raw: dict, terms: str) -> dict:
    """The profile `raw` with the terms of `terms` (a shipped name or a file) laid over it: a
    calibrated file's record in its provenance (the bands' basis), and one sentence on stderr
    where that file was calibrated over another derivation of this profile."""
    import sys

    from rlsim.derive.terms import calibrated_provenance, derivation_warning, load_terms, terms_record

    fitted, provenance = load_terms(terms)
    record = terms_record(terms)
    warning = derivation_warning(record, raw, terms)
    if warning:
        make_console(sys.stderr).print(warning, highlight=False, soft_wrap=True)
    out = fitted.apply(raw, provenance)
    calibrated = calibrated_provenance(record, terms)
    if calibrated is not None:
        out.setdefault("provenance", {})
        if not isinstance(out["provenance"], dict):
            out["provenance"] = {"source": out["provenance"]}
        out["provenance"]["calibrated"] = calibrated
    return out


def profile_with_terms(profile: str, terms: str) -> str:
    """A given profile (measured, or derived elsewhere) with `terms` laid over it, written beside
    the derived ones (keyed by both files' contents); its path."""
    from rlsim.files import atomic_write_text, read_json_object
    from rlsim.profile import load_profile, profile_file

    load_profile(profile)  # a bad profile is its own sentence, before the terms
    raw = lay_terms(read_json_object(profile_file(profile)), terms)
    key = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]
    folder = cache_dir() / "profiles" / key
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{raw.get('name', 'profile')}.json"
    atomic_write_text(path, json.dumps(raw, indent=2) + "\n")
    return str(path)


def profile_or_derived(
    profile: str,
    model: str | None,
    gpu: str | None,
    tp: int,
    ep: int,
    dtype: str,
    trainer: str = "fsdp2",
    terms: str | None = None,
    pp: int = 1,
    dp: int = 1,
    gpu_memory_utilization: float | None = None,
) -> str:
    """`--profile`, or the profile `--model/--gpu/--tp` derive (the two are exclusive), at the
    run's `gpu_memory_utilization` (None: veRL's default)."""
    if model is None and gpu is None:
        if trainer != "fsdp2" or pp != 1 or dp != 1:
            raise RlsimError(
                "--trainer, --pp and --dp go with --model and --gpu: a given --profile states its own costs"
            )
        return profile_with_terms(profile, terms) if terms else profile  # terms lie over any profile
    if model is None or gpu is None:
        raise RlsimError("--model and --gpu go together (with --tp): they derive the profile")
    return derived_profile_path(
        model, gpu, tp, ep, dtype, trainer, terms, pp, dp, gpu_memory_utilization=gpu_memory_utilization
    )


def derive_family(
    model: str | None,
    gpu: str | None,
    tps: tuple[int, ...],
    dtype: str,
    trainer: str = "fsdp2",
    terms: str | None = None,
    gpu_memory_utilization: float | None = None,
    kv_cache_dtype: str | None = None,
) -> tuple[str, tuple[int, ...]]:
    """`rlsim plan --model M --gpu G`: the derived profile at every TP asked (default: 1, 2, 4 and
    8 where the model derives: heads divided, weights fitting, within the scale-up domain), side by
    side so that the planner finds them as one family; the smallest TP's path, and the TPs.
    `gpu_memory_utilization`: the smallest the plan searches (None: veRL's default), so that the
    weights fit at every memory fraction searched; `kv_cache_dtype`: the KV cache's (None: `dtype`'s)."""
    if model is None or gpu is None:
        raise RlsimError("--model and --gpu go together: they derive the profiles the plan searches")
    paths: dict[int, str] = {}
    for t in tps or (1, 2, 4, 8):
        try:
            paths[t] = derived_profile_path(
                model, gpu, t, dtype=dtype, trainer=trainer, terms=terms,
                gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype,
            )  # fmt: skip
        except RlsimError:
            if tps:
                raise
    if not paths:
        raise RlsimError(f"{model} derives on {gpu} at none of TP 1, 2, 4, 8 (see rlsim profile derive)")
    return paths[min(paths)], tuple(sorted(paths))


def register_derive(profile_app: typer.Typer) -> None:
    """Add `rlsim profile derive` to the profile group."""

    @profile_app.command()
    def derive(
        model: str = typer.Option(..., help="A model name (rlsim profile list), a config.json or its directory."),
        gpu: str = typer.Option(..., help="A GPU name (rlsim profile list) or a JSON file of its datasheet facts."),
        tp: int = typer.Option(1, "--tp", help="Tensor-parallel size of one rollout instance."),
        ep: int = EP,
        pp: int = typer.Option(1, "--pp", help="Pipeline stages of one rollout instance (it takes TP x PP GPUs)."),
        dp: int = DP,
        dtype: str = DTYPE,
        kv_cache_dtype: str | None = typer.Option(None, help="KV cache dtype, bf16 or fp8 (default: --dtype)."),
        gpu_memory_utilization: float | None = typer.Option(
            None, help="vLLM gpu_memory_utilization the KV capacity is derived at (default: veRL's 0.5)."
        ),
        max_num_seqs: int | None = typer.Option(None, help="vLLM max_num_seqs (default: veRL's 1024)."),
        trainer: str = TRAINER,
        terms: str | None = TERMS,
        out: Path | None = typer.Option(None, "--out", "-o", help="Write the profile JSON here (default: print it)."),
        force: bool = typer.Option(False, "--force", help="Overwrite an existing --out file."),
    ) -> None:
        """A profile from a model's config and a GPU's datasheet: dense or MoE, GQA or MLA, bf16 or fp8, with
        the training cost of a trainer backend and layout."""
        from rlsim.derive.derive import derive_profile, setup
        from rlsim.derive.train import Trainer
        from rlsim.files import atomic_write_text
        from rlsim.profile import profile_from_dict
        from rlsim.roofline import check_roofline

        if out is not None:
            refuse_overwrite(out, force)
        engine = EngineConfig(gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs)
        raw = derive_profile(setup(model, gpu, tp, ep, dtype, kv_cache_dtype, pp, dp), engine, Trainer.parse(trainer))
        if terms:
            raw = lay_terms(raw, terms)
        prof = profile_from_dict(raw, raw["name"])
        check_roofline(prof, raw["name"])
        text = json.dumps(raw, indent=2) + "\n"
        if out is None:
            typer.echo(text, nl=False)
            return
        atomic_write_text(out, text)
        con = make_console()
        con.print(
            f"{out}: {raw['name']}, t_w {prof.t_w_s * 1e3:.2f} ms, KV capacity {prof.kv_capacity_tokens:,} tokens, "
            f"{prof.decode_throughput(64, 4096):,.0f} tok/s at batch 64 x 4K context"
        )


def tables() -> list[Table]:
    """The shipped model and GPU tables (`rlsim profile list`)."""
    from rlsim.derive.gpus import load_gpu, shipped_gpus
    from rlsim.derive.models import load_model, shipped_models

    models = Table(title="Models rlsim profile derive knows (rlsim/derive/models.json)", title_justify="left")
    for col in ("name", "config of", "params", "active", "attention", "KV bytes/token (bf16)"):
        models.add_column(col, justify="right" if col in ("params", "active", "KV bytes/token (bf16)") else "left")
    for name in shipped_models():
        m = load_model(name)
        kind = ("MLA" if m.is_mla else "GQA") + (f", MoE {m.experts_per_token}/{m.num_experts}" if m.is_moe else "")
        models.add_row(name, m.source, f"{m.num_params / 1e9:.1f}B", f"{m.num_active_params / 1e9:.1f}B", kind,
                       f"{m.kv_values_per_token() * 2:,}")  # fmt: skip
    gpus = Table(title="GPUs (rlsim/derive/gpus.json, each with its datasheet)", title_justify="left")
    for col in ("name", "GPU", "memory", "HBM", "bf16 dense", "fp8 dense", "scale-up", "domain"):
        gpus.add_column(col, justify="left" if col in ("name", "GPU") else "right")
    for key in shipped_gpus():
        g = load_gpu(key)
        fp8 = f"{g.fp8_flops_per_s / 1e12:,.0f} TF" if g.fp8_flops_per_s else "-"
        gpus.add_row(key, g.name, f"{g.memory_bytes / 1e9:.0f} GB", f"{g.hbm_bytes_per_s / 1e12:.2f} TB/s",
                     f"{g.bf16_flops_per_s / 1e12:,.0f} TF", fp8, f"{g.scale_up_bytes_per_s / 1e9:,.0f} GB/s",
                     str(g.scale_up_domain))  # fmt: skip
    return [models, gpus]
