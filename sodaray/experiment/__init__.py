"""The experiment layer the runner (`sodaray sweep`) and the tuner (`sodaray tune`) both stand on.

`spec`: model, dataset and objective entries of a YAML file parsed into dataclasses, the one
place presets (or a model's family defaults, `model_defaults`) meet parameters
(`algorithm_config`), and one-line errors naming file and field.
`data`: a dataset entry's rows. `cluster`: joining or starting Ray. `replica`: loading a model
entry inside a Ray actor. Neither the runner nor the tuner imports the other.
"""
