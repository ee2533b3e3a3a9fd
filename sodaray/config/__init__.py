"""Config rules: YAML documents and their includes, field checks with one-line errors, what a run
needs of the machine, SODA's presets and the model families that pick them."""
