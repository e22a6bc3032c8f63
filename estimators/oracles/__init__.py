"""Single-attribute frequency oracles (docs/mechanisms.md)."""
