# Helpers shared by the rules.


def _train(model, key, default=None):
    """A model's training setting from the config, or ``default``."""
    return config["models"][model]["train"].get(key, default)


def train_extra_args(model):
    """Optional `pipedream train` flags: link throttle, optimizer, time-to-accuracy threshold."""
    args = []
    if config.get("emulate_bandwidth_Bps"):
        args.append(f"--emulate-bandwidth {config['emulate_bandwidth_Bps']}")
    if _train(model, "optimizer"):
        args.append(f"--optimizer {_train(model, 'optimizer')}")
    launch = config.get("launch", {})
    if launch.get("nnodes", 1) > 1:
        args.append(f"--nnodes {launch['nnodes']} --rdzv-endpoint {launch['rdzv_endpoint']} "
                    f"--node-rank {launch.get('node_rank', '0')}")
    if _train(model, "max_minibatches"):
        args.append(f"--max-minibatches {_train(model, 'max_minibatches')}")
    threshold = config["models"][model].get("threshold")
    if threshold and threshold["metric"] in ("top1", "perplexity"):
        args.append(f"--threshold {threshold['value']} --threshold-metric {threshold['metric']}")
    return " ".join(args)
