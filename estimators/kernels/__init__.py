"""Numeric building blocks shared by the families, pure numpy: domains, channels, inversions,
consistency, joint estimators (docs/estimators.md)."""
