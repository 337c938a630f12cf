"""MPS in the device plugin: one MPS control daemon per card, and the containers' MPS environment."""
