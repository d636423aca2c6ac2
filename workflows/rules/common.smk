# Helpers shared by the rules.


def _train(model, key, default=None):
    """A model's training setting from the config, or ``default``."""
    return config["models"][model]["train"].get(key, default)
