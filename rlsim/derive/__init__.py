"""Profiles for any model on any GPU: `rlsim.derive.derive.derive_profile` (and `rlsim profile
derive`) from a Hugging Face config (`models`) and a GPU datasheet (`gpus`), the linear layers by
a roofline fitted to measured H100 operators (`operators`)."""
