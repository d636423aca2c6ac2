# PipeDream-2BW's table (experiments/2bw.yaml, `make run-2bw`): the 2BW planner's plan for the measured pipeline,
# one training run per schedule, then pipedream table2bw (measured and paper-scale predicted rows). TWOBW and
# twobw_train_args are in common.smk.


rule plan_2bw:
    """PipeDream-2BW's planner for the measured pipeline (depth and microbatch pinned by the config)."""
    input:
        graph=f"{RESULTS}/profiles/{{model}}/graph.txt",
        clusters=config.get("clusters_file", "experiments/clusters.yaml"),
    output:
        f"{RESULTS}/plans_2bw/{{model}}/{{cluster}}.json",
    log:
        f"{RESULTS}/logs/plan_2bw/{{model}}_{{cluster}}.log",
    params:
        pd=PD,
        batch=lambda w: config["models"][w.model]["train"]["batch_size"],
        depth=TWOBW.get("depth", 1),
        microbatch=TWOBW.get("microbatch", 1),
    conda:
        "../../environment.yml"
    threads: 1
    priority: PRIORITY["plan"]
    shell:
        "{params.pd} plan --planner 2bw --profile {input.graph} --clusters {input.clusters} --cluster {wildcards.cluster} "
        "--model {wildcards.model} --batch-size {params.batch} --depth {params.depth} --microbatch {params.microbatch} "
        "--recompute off --out {output} > {log} 2>&1"


rule train_2bw:
    """Train the 2BW table's model with one schedule (or DP); logged to MLflow as <model>/2bw, run name per schedule
    (the loss check's runs, e.g. 2bw-muon, as <model>/2bw-muon)."""
    input:
        plan=f"{RESULTS}/plans_2bw/{{model}}/{CLUSTER}.json",
        profile=f"{RESULTS}/profiles/{{model}}/graph.txt",
        clusters=config.get("clusters_file", "experiments/clusters.yaml"),
    output:
        f"{RESULTS}/runs_2bw/{{model}}/{{schedule}}/run.json",
    log:
        f"{RESULTS}/logs/train_2bw/{{model}}_{{schedule}}.log",
    wildcard_constraints:
        schedule="(2bw|gpipe|pipedream_flush|1f1b|dp)(-(sgd|adam|muon))?",
    params:
        pd=PD,
        preset=lambda w: config["models"][w.model]["preset"],
        workers=config["workers"],
        schedule=lambda w: twobw_train_args(w.schedule),
        train=lambda w: flags_from_experiment(config["models"][w.model]["train"]),
        extra=lambda w: train_extra_args(w.model),
        optimizer=lambda w: twobw_optimizer_args(w.schedule),
    conda:
        "../../environment.yml"
    threads: workflow.cores
    priority: PRIORITY["train"]
    resources:
        workers=config["workers"],
    shell:
        "{params.pd} train {params.schedule} --model {wildcards.model} --preset {params.preset} --plan {input.plan} "
        "--profile {input.profile} --clusters {input.clusters} --workers {params.workers} {params.train} "
        "{params.optimizer} {params.extra} --no-progress --out-dir $(dirname {output}) > {log} 2>&1"


rule table_2bw:
    """PipeDream-2BW's table: the measured runs beside the paper-scale predictions."""
    input:
        runs=expand(f"{RESULTS}/runs_2bw/{TWOBW.get('model', 'none')}/{{schedule}}/run.json", schedule=TWOBW_SCHEDULES + TWOBW_LOSS_RUNS),
        clusters=config.get("clusters_file", "experiments/clusters.yaml"),
    output:
        md=f"{RESULTS}/table_2bw.md",
        csv=f"{RESULTS}/table_2bw.csv",
        curve=f"{RESULTS}/table_2bw_val_loss.csv",
        page=f"{RESULTS}/report_2bw.html",
    log:
        f"{RESULTS}/logs/table_2bw.log",
    params:
        pd=PD,
        config_file=CONFIG_FILE,
    conda:
        "../../environment.yml"
    threads: 1
    shell:
        "{params.pd} table2bw --config {params.config_file} --clusters {input.clusters} > {log} 2>&1"
