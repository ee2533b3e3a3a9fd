"""SODA (Algorithm 1 of the paper) read top to bottom: its config, its packed state, the relaxed
pass, the step, the hard-max screen, the fused kernels and the batch the engine drives."""
