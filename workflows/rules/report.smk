rule report:
    """Table 1 (paper beside measured) and the plots."""
    input:
        runs=expand(f"{RESULTS}/runs/{{model}}/{{mode}}/run.json", model=MODELS, mode=MODES),
        plans=expand(f"{RESULTS}/plans/{{model}}/{CLUSTER}.json", model=MODELS),
        paper=config["paper_table"],
    output:
        md=f"{RESULTS}/table1.md",
        csv=f"{RESULTS}/table1.csv",
        plots=expand(f"{RESULTS}/plots/{{model}}_accuracy_vs_time.png", model=MODELS),
    log:
        f"{RESULTS}/logs/report.log",
    params:
        pd=PD,
        config_file=workflow.configfiles[-1] if workflow.configfiles else "experiments/ci.yaml",
    conda:
        "../../environment.yml"
    threads: 1
    shell:
        "{params.pd} report --config {params.config_file} > {log} 2>&1"
