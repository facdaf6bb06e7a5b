"""rlsim tests."""
