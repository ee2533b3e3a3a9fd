"""Config rules: YAML documents and their includes, field checks with one-line errors, SODA's
presets and the model families that pick them."""
