"""Per-request response caps as vLLM applies them: min(max_response_len, max_model_len less the
request's prompt), in the engine (the fast path and --exact) and in the trace check, so that a
trace capped at the model length less each prompt runs under the config that capped it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.cli.options import check_len
from rlsim.config import ClusterConfig, RLConfig
from rlsim.errors import RlsimError
from rlsim.sim.simulate import simulate
from rlsim.trace.format import save
from rlsim.trace.synth import SynthConfig, synthesize

runner = CliRunner()


def _trace(cap: int = 4096, prompts: int = 32):  # noqa: ANN202 - a Trace whose prompts run from 50 to 2,000 tokens
    lengths = np.linspace(50, 2000, prompts).astype(int)
    table = pd.DataFrame({"prompt_id": np.arange(prompts), "num_prompt_tokens": lengths})
    return synthesize(SynthConfig(num_prompts=prompts, samples_per_prompt=4, epochs=1, prompts_per_step=16,
                                  max_response_len=cap, length_scale=3.0, seed=3), table)  # fmt: skip


@pytest.mark.parametrize("exact", [False, True])
def test_the_engine_caps_each_response_at_the_model_length_less_its_prompt(exact: bool) -> None:
    tr = _trace()
    rl = RLConfig(prompts_per_step=16, samples_per_prompt=4, epochs=1, max_response_len=4096, max_model_len=4096)
    res = simulate(tr, cluster=ClusterConfig(num_gpus=2, profile="h100-qwen2.5-7b-tp1"), rl=rl, exact=exact)
    req = res.requests
    room = 4096 - req.num_prompt_tokens
    assert (req.num_output_tokens <= room).all()
    wanted = tr.table.set_index(["prompt_id", "sample_idx"]).num_output_tokens
    target = wanted.loc[list(zip(req.prompt_id, req.sample_idx, strict=True))].to_numpy()
    cut = (target > room.to_numpy()) & (target < 4096)  # cut by the model length, not by max_response_len
    assert cut.sum() > 0  # the workload exercises the per-request cap
    assert (req.num_output_tokens.to_numpy() == np.minimum(target, room.to_numpy())).all()
    plain = simulate(tr, cluster=ClusterConfig(num_gpus=2, profile="h100-qwen2.5-7b-tp1"),
                     rl=RLConfig(prompts_per_step=16, samples_per_prompt=4, epochs=1, max_response_len=4096),
                     exact=exact)  # fmt: skip
    assert plain.requests.num_output_tokens.sum() > req.num_output_tokens.sum()


def test_a_trace_capped_at_the_model_length_less_its_prompt_is_accepted() -> None:
    """NeMo RL's recipes set max_new_tokens to the model length: a trace whose cap is the model
    length less its shortest prompt fits; one that would let a response run past it does not."""
    tr = _trace(cap=4096 - 50)
    check_len(tr, 4096, 4096)  # every request's cap: 4096 less its prompt, at most the trace's 4046
    with pytest.raises(RlsimError, match="max_response_len=4096 exceeds the trace's cap 4046"):
        check_len(tr, 4096)
    with pytest.raises(RlsimError, match="past the trace's cap 4046"):
        check_len(tr, 4096, 4200)
    with pytest.raises(RlsimError, match="leaves no room under max_model_len=2,000"):
        check_len(tr, 4096, 2000)


def test_simulate_takes_max_model_len(tmp_path) -> None:  # noqa: ANN001
    path = save(_trace(cap=4096 - 50), tmp_path / "t.parquet")
    base = ["simulate", "--trace", str(path), "--profile", "h100-qwen2.5-7b-tp1", "--gpus", "2", "--max-steps", "1",
            "--prompts-per-step", "16", "--samples-per-prompt", "4", "--max-response-len", "4096"]  # fmt: skip
    r = runner.invoke(app, [*base, "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "exceeds the trace's cap 4046" in r.stderr
    r = runner.invoke(app, [*base, "--max-model-len", "4096", "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    req = pd.read_parquet(tmp_path / "b" / "requests.parquet")
    assert (req.num_output_tokens <= 4096 - req.num_prompt_tokens).all()
