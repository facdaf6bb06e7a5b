"""A run described by its framework's own config (`--from verl:CONFIG`): the readers, and the
setup they map a config to (`rlsim.frameworks.run_setup.RunSetup`), which the commands that
simulate turn into rlsim's options. The readers merge configs with OmegaConf, as the frameworks'
own Hydra does, over the defaults of one named release, vendored beside them."""
