"""What an inversion aims at: the objectives, what an observation records, the target sets built
from inputs, text or logits, and the scoring of candidates against them."""
