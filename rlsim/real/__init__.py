"""Real mode: the same driver and policy objects on real vLLM engines, with real GRPO training.

Entry points: `rlsim.real.run.RealRun` (`rlsim run --real`; its config in `run_config`, its files
in `run_files`, its training side in `learn`, its in-run calibration in `run_calibration`),
`rlsim.real.engine.RealEngine` (vLLM engines behind the `Engine` protocol, each a
`rlsim.real.vllm_instance.VllmInstance` here or on a Ray actor, `rlsim.real.backends`),
`rlsim.real.trainer` and `rlsim.real.grpo` (a torch copy of the model and veRL's loss functions),
`rlsim.real.rewards` and `rlsim.real.validate` (`rlsim validate`: a real run or a veRL log against
the simulator, split into its schedule and iteration-model parts by `rlsim.real.validate_parts`).
Imports the core, trace, spec and the simulator; vLLM and torch only inside functions.
"""
