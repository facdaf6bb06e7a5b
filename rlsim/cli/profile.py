"""`rlsim profile ...`: the shipped and calibrated cost models, held against the memory roofline."""

from __future__ import annotations

import json
from dataclasses import asdict

import typer
from rich.table import Table

from rlsim.cli.derive import register_derive, tables
from rlsim.cli.ui import console as make_console

profile_app = typer.Typer(
    help="List profiles, show one against the memory roofline, derive one for any model on any GPU.",
    no_args_is_help=True,
)
register_derive(profile_app)


@profile_app.command("list")
def list_() -> None:
    """Shipped profiles (hardware, model, tensor parallelism, KV capacity), and the models and GPUs
    `rlsim profile derive` knows."""
    from rlsim.profile import load_profile, shipped_profiles

    table = Table(title="Shipped profiles (rlsim/profiles/)", title_justify="left")
    for col in ("name", "hardware", "model", "TP", "KV tokens"):
        table.add_column(col, justify="right" if col in ("TP", "KV tokens") else "left")
    for name in shipped_profiles():
        p = load_profile(name)
        table.add_row(name, p.hardware, p.model, str(p.tensor_parallel_size), f"{p.kv_capacity_tokens:,}")
    con = make_console()
    con.print(table)
    for t in tables():
        con.print(t)


@profile_app.command()
def show(
    name: str = typer.Argument(..., help="Shipped profile name or JSON path."),
    as_json: bool = typer.Option(False, "--json", help="Print the grid as JSON."),
) -> None:
    """Decode tok/s over batch x context and each cell's fraction of the memory roofline."""
    from rlsim.profile import load_profile
    from rlsim.roofline import grid, has_roofline

    profile = load_profile(name)
    cells = grid(profile) if has_roofline(profile) else []
    if as_json:
        typer.echo(json.dumps({"profile": profile.name, "cells": [asdict(c) for c in cells]}, indent=2))
        return
    con = make_console()
    _print_facts(con, profile)
    if not cells:
        con.print(
            "no roofline: the profile does not state model_facts (num_params, num_layers, num_kv_heads, head_dim, "
            "dtype_bytes) and gpu_facts.hbm_bytes_per_s (CPU profiles need not)"
        )
        return
    con.print(_grid_table(cells))


def _print_facts(con, profile) -> None:  # noqa: ANN001 - a rich Console, a Profile
    """What the profile is: its setup, its iteration's fixed costs and its training cost."""
    from rlsim.rollout_engines import rollout_engine

    con.print(
        f"[bold]{profile.name}[/]  {profile.hardware}, {profile.model}, TP {profile.tensor_parallel_size}"
        + (f" x PP {profile.pipeline_parallel_size}" if profile.pipeline_parallel_size > 1 else "")
        + ", "
        f"KV capacity {profile.kv_capacity_tokens:,} tokens, max_num_seqs {profile.engine.max_num_seqs}, "
        f"measured on {rollout_engine(profile.rollout_engine).label}",
        highlight=False,
    )
    con.print(
        f"iteration: t_w {profile.t_w_s * 1e3:.3g} ms, per prefilling request "
        f"{profile.prefill_request_s * 1e6:.3g} us{'' if profile.prefill_request_s else ' (not measured or fitted)'}",
        highlight=False,
    )
    tc = profile.train
    if profile.model_facts and tc.backend:
        from rlsim.step_costs import weight_sync_s

        domain = int(profile.gpu_facts.get("scale_up_domain", 8))
        con.print(
            f"training: {tc.backend} at {tc.mfu:.1%} MFU of {tc.peak_flops_per_gpu / 1e12:,.0f} TFLOP/s per GPU, "
            f"layout TP {tc.tp} PP {tc.pp} EP {tc.ep} CP {tc.cp}"
            + "".join(f", {k} {v}" for k, v in tc.framework.stated().items())
            + f"; weight sync {weight_sync_s(profile, domain):.2f} s "
            f"within a scale-up domain ({domain} GPUs), {weight_sync_s(profile, domain + 1):.2f} s beyond",
            highlight=False,
        )


def _grid_table(cells: list) -> Table:
    """Decode output tok/s over batch x context, each cell's fraction of the memory roofline."""
    from rlsim.roofline import BATCHES, CONTEXTS

    by = {(c.batch, c.context): c for c in cells}
    table = Table(title="Decode output tok/s (fraction of the memory roofline)", title_justify="left")
    table.add_column("batch \\ context", justify="right")
    for ctx in CONTEXTS:
        table.add_column(f"{ctx:,}", justify="right")
    for b in BATCHES:
        row = []
        for ctx in CONTEXTS:
            c = by[(b, ctx)]
            mark = "" if c.kv_fits else " *"
            style = "red" if c.roofline_fraction > 1 else ("yellow" if c.roofline_fraction > 0.75 else "")
            text = f"{c.tokens_per_s:,.0f} ({c.roofline_fraction:.0%}){mark}"
            row.append(f"[{style}]{text}[/]" if style else text)
        table.add_row(str(b), *row)
    table.caption = (
        "roofline: (weights the batch reads / TP + batch x context x KV bytes per token per rank) / HBM bandwidth, "
        "the least time "
        "an iteration can take; real engines reach about 50-70% of it; yellow above 75%, red above 100% "
        "(impossible); * the KV does not fit (batch x context above the KV capacity, or batch above max_num_seqs)"
    )
    return table
