"""File rules: paths inside an output folder, reads that check what they read, writes that never
follow a link, strict JSON, and the checks of model files before a loader sees them."""
