# Helpers shared by the rules.
from pipedream.experiment import model_data
from pipedream.runtime.config import TrainConfig, flags_from_experiment
from pipedream.experiment import THRESHOLD_METRICS
from pipedream.runtime.config import SCHEDULES as RUNTIME_SCHEDULES

# The order of jobs among those ready: depth first, each model's plan and then its training runs before the
# next model's profile (snakemake's `priority`; profile and the rest keep 0). Every run predicts its epoch time
# from its profile, and a shared CPU host's speed drifts over minutes; breadth first, all seven profiles would run
# before the first training, up to half an hour before the runs that read them. A model's results also land as soon as its runs finish.
PRIORITY = {"plan": 1, "train": 2}


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
# the loss check (twobw.loss_check): some schedules trained again with another optimizer, run folders <schedule>-<opt>
TWOBW_LOSS = TWOBW.get("loss_check", {})
TWOBW_LOSS_RUNS = [f"{s}-{TWOBW_LOSS['optimizer']}" for s in TWOBW_LOSS.get("schedules", [])
                   if s == "dp" or s in RUNTIME_SCHEDULES]
TWOBW_OUTPUTS = [f"{RESULTS}/table_2bw.md", f"{RESULTS}/table_2bw.csv", f"{RESULTS}/table_2bw_val_loss.csv",
                 f"{RESULTS}/report_2bw.html"]


def twobw_train_args(schedule):
    """`pipedream train` flags of one schedule (a run folder name: ``2bw``, or ``2bw-muon`` for the loss check; the
    optimizer flag is twobw_optimizer_args'): the same batch per update for all (see experiments/2bw.yaml)."""
    schedule = schedule.split("-")[0]
    model = TWOBW["model"]
    batch = config["models"][model]["train"]["batch_size"]
    if schedule == "dp":
        return "--mode dp --dp-batch global"
    if schedule == "1f1b":
        return "--mode pipedream --schedule 1f1b"
    return f"--mode pipedream --schedule {schedule} --microbatches {batch // TWOBW['microbatch']}"


def run_optimizer(model):
    """The optimizer ``model``'s training runs use (its ``train.optimizer``, TrainConfig's default where unset): the
    plan charges its step (`pipedream plan --optimizer`)."""
    return config["models"][model].get("train", {}).get("optimizer", TrainConfig().optimizer)


def plan_runtime_args(model):
    """`pipedream plan` flags of ``model``'s runtime: with ``train.runtime: torch``, a plan of torch's schedules for
    the run's minibatch (docs/torch-runtime.md); nothing for ours."""
    train = config["models"][model].get("train", {})
    if train.get("runtime", "pipedream") != "torch":
        return ""
    return f"--runtime torch --batch-size {train['batch_size']}"


def profile_optimizers(model):
    """The optimizers whose step `pipedream profile --optimizers` times for ``model``: those its runs train with
    (its ``train.optimizer``, TrainConfig's default where unset, and the 2BW loss check's for the 2BW model). The
    rest are not timed: Muon's step takes seconds on a CPU."""
    names = [run_optimizer(model)]
    if TWOBW and TWOBW.get("model") == model and TWOBW_LOSS:
        names.append(TWOBW_LOSS["optimizer"])
    return " ".join(dict.fromkeys(names))


def twobw_optimizer_args(run):
    """The loss check's flags of a 2BW-table run folder name: ``--optimizer muon`` and its own MLflow experiment
    (``<model>/2bw-muon``) for ``2bw-muon``, so it does not retire the config optimizer's run of the same name;
    the default experiment ``<model>/2bw`` otherwise."""
    model = TWOBW["model"]
    if "-" not in run:
        return f"--experiment {model}/2bw"
    optimizer = run.split("-")[1]
    return f"--optimizer {optimizer} --experiment {model}/2bw-{optimizer}"
