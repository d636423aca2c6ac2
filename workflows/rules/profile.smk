rule profile:
    """Per-layer profile of one model (forward/backward seconds, activation and parameter bytes)."""
    output:
        graph=f"{RESULTS}/profiles/{{model}}/graph.txt",
        meta=f"{RESULTS}/profiles/{{model}}/meta.json",
    log:
        f"{RESULTS}/logs/profile/{{model}}.log",
    params:
        pd=PD,
        preset=lambda w: config["models"][w.model]["preset"],
        batch=config["profile"]["batch_size"],
        warmup=config["profile"]["warmup"],
        iters=config["profile"]["iters"],
        device=config["profile"]["device"],
        optimizers=lambda w: profile_optimizers(w.model),  # whose optimizer step to time: those the runs use
    conda:
        "../../environment.yml"
    # alone on the host: the layers' times are the model's own, not shared with another job
    threads: workflow.cores
    shell:
        "{params.pd} profile --model {wildcards.model} --preset {params.preset} --profiled-batch {params.batch} "
        "--warmup {params.warmup} --iters {params.iters} --device {params.device} "
        "--optimizers {params.optimizers} "
        "--out-dir $(dirname {output.graph}) > {log} 2>&1"
