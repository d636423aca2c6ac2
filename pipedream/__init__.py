"""pipedream-repro: a working reproduction of PipeDream (SOSP 2019) and PipeDream-2BW.

As a library: ``pipedream.profile(model, example)``, ``pipedream.partition(profile, cluster)`` and
``pipedream.train(model, plan, datasets, config)`` (:mod:`pipedream.api`).
"""

__version__ = "0.1.0"

# the library's entry points (pipedream.api), imported on first use so that `pipedream --help` stays quick
_API = {"profile", "partition", "train"}


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    if name in _API:
        from pipedream import api

        return getattr(api, name)
    if name == "TrainConfig":
        from pipedream.runtime.config import TrainConfig

        return TrainConfig
    raise AttributeError(f"module 'pipedream' has no attribute {name!r}")
