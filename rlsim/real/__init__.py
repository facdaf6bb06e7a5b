"""Real mode: the same driver and policy objects on real vLLM engines, with real GRPO training.

Entry points: `rlsim.real.run.RealRun` (`rlsim run --real`), `rlsim.real.engine.RealEngine` (vLLM
engines behind the `Engine` protocol, one `rlsim.real.vllm_instance` each), `rlsim.real.trainer` and
`rlsim.real.grpo` (a torch copy of the model and veRL's loss functions), `rlsim.real.rewards`,
`rlsim.real.run_calibration` (a profile measured in the run's own window) and
`rlsim.real.validate` (`rlsim validate`: a real run or a veRL log against the simulator, split into
its schedule and iteration-model parts by `rlsim.real.validate_parts`). Imports the core, trace,
spec and the simulator; vLLM and torch only inside functions.
"""
