# Helpers shared by the rules.
from pipedream.experiment import model_data
from pipedream.runtime.config import flags_from_experiment
from pipedream.experiment import THRESHOLD_METRICS
from pipedream.runtime.config import SCHEDULES as RUNTIME_SCHEDULES


def train_extra_args(model):
    """`pipedream train` flags that come from the config's top level: data, link throttle, launch, run limit,
    threshold (real data only: random labels have no accuracy to reach; a BLEU threshold makes the run score
    every epoch's model after training, pipedream.commands.train; METEOR is never scored: no threshold).

    The model's own `train:` section becomes flags through `flags_from_experiment` (one definition of every
    training option and its default: pipedream.runtime.config.TrainConfig)."""
    args = []
    if "data" not in config["models"][model]["train"] and config.get("data"):  # the top-level default
        args.append(f"--data {config['data']}")
    if config.get("emulate_bandwidth_Bps"):
        args.append(f"--emulate-bandwidth-Bps {config['emulate_bandwidth_Bps']}")
    launch = config.get("launch", {})
    if launch.get("nnodes", 1) > 1:
        args.append(f"--nnodes {launch['nnodes']} --rdzv-endpoint {launch['rdzv_endpoint']} "
                    f"--node-rank {launch.get('node_rank', '0')}")
    epochs = config["models"][model]["train"]["epochs"]  # the whole-run limit grows with the run
    args.append(f"--timeout-s {epochs * config.get('train_epoch_timeout_s', 1800) + 600:g}")
    threshold = config["models"][model].get("threshold")
    if threshold and threshold["metric"] in THRESHOLD_METRICS and model_data(config, model) == "real":
        args.append(f"--threshold {threshold['value']} --threshold-metric {threshold['metric']}")
    return " ".join(args)


TWOBW = config.get("twobw", {})
# schedules this checkout can train: pipeline schedules its runtime has, and dp
TWOBW_SCHEDULES = [s for s in TWOBW.get("schedules", []) if s == "dp" or s in RUNTIME_SCHEDULES]
TWOBW_OUTPUTS = [f"{RESULTS}/table_2bw.md", f"{RESULTS}/table_2bw.csv", f"{RESULTS}/table_2bw_val_loss.csv"]


def twobw_train_args(schedule):
    """`pipedream train` flags of one schedule: the same batch per update for all (see experiments/2bw.yaml)."""
    model = TWOBW["model"]
    batch = config["models"][model]["train"]["batch_size"]
    if schedule == "dp":
        return "--mode dp --dp-batch global"
    if schedule == "1f1b":
        return "--mode pipedream --schedule 1f1b"
    return f"--mode pipedream --schedule {schedule} --microbatches {batch // TWOBW['microbatch']}"
