rule plan:
    """PipeDream's partitioner (paper §3.1) for one model on one cluster."""
    input:
        graph=f"{RESULTS}/profiles/{{model}}/graph.txt",
        clusters=config.get("clusters_file", "experiments/clusters.yaml"),
    output:
        f"{RESULTS}/plans/{{model}}/{{cluster}}.json",
    log:
        f"{RESULTS}/logs/plan/{{model}}_{{cluster}}.log",
    params:
        pd=PD,
        optimizer=lambda w: run_optimizer(w.model),  # the plan charges the step of the optimizer the runs use
        runtime=lambda w: plan_runtime_args(w.model),
    conda:
        "../../environment.yml"
    threads: 1
    # depth first: a model's plan and training runs go before the next model's profile (PRIORITY in common.smk)
    priority: PRIORITY["plan"]
    shell:
        "{params.pd} plan --profile {input.graph} --clusters {input.clusters} --cluster {wildcards.cluster} "
        "--model {wildcards.model} --optimizer {params.optimizer} {params.runtime} --out {output} > {log} 2>&1"
