"""`rlsim profile derive`: a profile from a model's config and a GPU's datasheet (`rlsim.derive`; the
derived profiles of the simulating commands' `--model/--gpu/--tp` and their cache are
`rlsim.derive.cache`, their options `rlsim.cli.run_options.ProfileOptions`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from rlsim.cli.engine_options import field_option
from rlsim.cli.options import refuse_overwrite
from rlsim.cli.run_options import ProfileOptions
from rlsim.cli.ui import console as make_console
from rlsim.config import EngineConfig


def register_derive(profile_app: typer.Typer) -> None:
    """Add `rlsim profile derive` to the profile group."""

    @profile_app.command()
    def derive(
        model: str = typer.Option(..., help="A model name (rlsim profile list), a config.json or its directory."),
        gpu: str = typer.Option(..., help="A GPU name (rlsim profile list) or a JSON file of its datasheet facts."),
        tp: int = typer.Option(1, "--tp", help="Tensor-parallel size of one rollout instance."),
        ep: int = field_option(ProfileOptions, "ep"),
        pp: int = typer.Option(1, "--pp", help="Pipeline stages of one rollout instance (it takes TP x PP GPUs)."),
        dp: int = field_option(ProfileOptions, "dp"),
        dtype: str = field_option(ProfileOptions, "dtype"),
        kv_cache_dtype: str | None = typer.Option(None, help="KV cache dtype, bf16 or fp8 (default: --dtype)."),
        gpu_memory_utilization: float | None = typer.Option(
            None, help="vLLM gpu_memory_utilization the KV capacity is derived at (default: veRL's 0.5)."
        ),
        max_num_seqs: int | None = typer.Option(None, help="vLLM max_num_seqs (default: veRL's 1024)."),
        trainer: str = field_option(ProfileOptions, "trainer"),
        terms: str | None = field_option(ProfileOptions, "terms"),
        out: Path | None = typer.Option(None, "--out", "-o", help="Write the profile JSON here (default: print it)."),
        force: bool = typer.Option(False, "--force", help="Overwrite an existing --out file."),
    ) -> None:
        """A profile from a model's config and a GPU's datasheet: dense or MoE, GQA or MLA, bf16 or fp8, with
        the training cost of a trainer backend and layout."""
        from rlsim.derive.cache import lay_terms
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
