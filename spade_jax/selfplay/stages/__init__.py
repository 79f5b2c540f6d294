"""Self-play's stages, one room each, in the order an iteration runs them.

`design` (or the baselines' draw) -> `hints` -> `play` -> `credit` -> `train`. Each maps
the iteration state and its inputs to a new state, its outputs and its metrics; a room
imports the floor (`selfplay.config`, `state`, `roles`) and earlier rooms only.
"""
