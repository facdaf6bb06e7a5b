"""History-based speculative decoding (RhymeRL's HistoSpec), an engine feature any policy can pair with.

Entry points: `rlsim.spec.drafter` (the suffix-tree drafter over earlier epochs' responses, the very
module vLLM loads through `rlsim.real.histospec_proposer`) and `rlsim.spec.speculation` (`SpecModel`:
per-request draft acceptance and tokens per iteration for the simulator). Knobs: `rlsim.config.SpecConfig`.
Imports only the core.
"""
