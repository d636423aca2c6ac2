"""pipedream-repro: a working reproduction of PipeDream (SOSP 2019) and PipeDream-2BW."""

__version__ = "0.1.0"
