"""A learned inversion baseline: a T5 encoder-decoder trained on the target model's own outputs
(Morris et al. 2023 style), run behind `sodaray.invert` as algorithm "inverter"."""
