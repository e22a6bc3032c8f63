"""ldpstream: live joint-distribution estimates from telemetry under local differential privacy."""
__version__ = "0.1.0"
