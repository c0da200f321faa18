"""Command-line front ends, one module per area; each exposes ``register(subparsers)``.

This layer may import every delaylab package; the packages never import it.
"""
