"""The mechanism families registered in :mod:`ldpstream.estimators.mechanism`, and the code only
one family uses, named after it (docs/mechanisms.md)."""
