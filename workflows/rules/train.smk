rule train:
    """Train one model with PipeDream (1F1B, weight stashing) or data parallelism (DDP); log to MLflow, with the
    epoch time the simulator predicts for the run from its profile, plan and cluster (both modes)."""
    input:
        plan=f"{RESULTS}/plans/{{model}}/{CLUSTER}.json",
        profile=f"{RESULTS}/profiles/{{model}}/graph.txt",
        clusters=config.get("clusters_file", "experiments/clusters.yaml"),
    output:
        f"{RESULTS}/runs/{{model}}/{{mode}}/run.json",
    log:
        f"{RESULTS}/logs/train/{{model}}_{{mode}}.log",
    wildcard_constraints:
        mode="pipedream|dp",
    params:
        pd=PD,
        preset=lambda w: config["models"][w.model]["preset"],
        workers=config["workers"],
        train=lambda w: flags_from_experiment(config["models"][w.model]["train"]),
        experiment=lambda w: f"{w.model}/{CLUSTER}",
        extra=lambda w: train_extra_args(w.model),
        prefix=config.get("launch", {}).get("prefix", ""),
    conda:
        "../../environment.yml"
    threads: workflow.cores
    priority: PRIORITY["train"]
    resources:
        workers=config["workers"],
        nodes=config.get("launch", {}).get("nnodes", 1),
    shell:
        "{params.prefix} {params.pd} train --mode {wildcards.mode} --model {wildcards.model} --preset {params.preset} "
        "--plan {input.plan} --profile {input.profile} --clusters {input.clusters} --workers {params.workers} {params.train} "
        "--experiment {params.experiment} {params.extra} --no-progress --out-dir $(dirname {output}) > {log} 2>&1"
