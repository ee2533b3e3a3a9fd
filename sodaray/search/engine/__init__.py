"""The engine: one batch per model replica that searches enter and leave step by step (the loop,
the pool of slots, the work items), and how a step's passes are planned and run."""
