rule speedup:
    """Measured epoch-time and time-to-accuracy speedup of PipeDream over DP for one model."""
    input:
        runs=expand(f"{RESULTS}/runs/{{{{model}}}}/{{mode}}/run.json", mode=MODES),
        plan=f"{RESULTS}/plans/{{model}}/{CLUSTER}.json",
    output:
        f"{RESULTS}/speedup/{{model}}.json",
    log:
        f"{RESULTS}/logs/speedup/{{model}}.log",
    params:
        pd=PD,
        config_file=CONFIG_FILE,
    conda:
        "../../environment.yml"
    threads: 1
    shell:
        "{params.pd} report --config {params.config_file} --speedup {wildcards.model} --out {output} > {log} 2>&1"


rule predicted:
    """Table 1 predicted at paper scale: V100 profiles -> planner -> simulator (clusters A, B, C); and every pipeline
    schedule's best at paper scale (schedules_whatif.csv, docs/schedules.md)."""
    input:
        paper=config["paper_table"],
        clusters=config.get("clusters_file", "experiments/clusters.yaml"),
        release_runs="experiments/release_runs.yaml",
        own_profiles=expand(f"{RESULTS}/profiles/{{model}}/graph.txt", model=OWN_PROFILE_MODELS),
    output:
        csv=f"{RESULTS}/table1_predicted.csv",
        md=f"{RESULTS}/table1_predicted.md",
        calibration=f"{RESULTS}/table1_calibration.csv",
    log:
        f"{RESULTS}/logs/predicted.log",
    params:
        pd=PD,
        out_dir=lambda w, output: os.path.dirname(output.csv) or ".",
        models=PREDICTED_MODELS_ARG,
    conda:
        "../../environment.yml"
    # its rows in parallel (every model's plan, re-ranking and simulations on every cluster)
    threads: workflow.cores
    shell:
        "{params.pd} report --predicted --schedules --out-dir {params.out_dir} --paper-table {input.paper} "
        "--clusters {input.clusters} --profiles-dir {params.out_dir}/profiles --jobs {threads} {params.models} "
        "> {log} 2>&1"


rule report:
    """Table 1 (paper, predicted, measured), the prediction check (every run's measured against predicted epoch
    time), the memory check (every stage's measured against predicted peak bytes), the plots and report.html."""
    input:
        speedups=expand(f"{RESULTS}/speedup/{{model}}.json", model=MODELS),
        runs=expand(f"{RESULTS}/runs/{{model}}/{{mode}}/run.json", model=MODELS, mode=MODES),
        predicted=f"{RESULTS}/table1_predicted.csv",
        paper=config["paper_table"],
    output:
        md=f"{RESULTS}/table1.md",
        csv=f"{RESULTS}/table1.csv",
        html=f"{RESULTS}/report.html",
        plots=expand(f"{RESULTS}/plots/{{model}}_accuracy_vs_time.png", model=MODELS),
        bars=f"{RESULTS}/plots/table1_speedups.png",
        check=f"{RESULTS}/prediction_check.csv",
        check_plot=f"{RESULTS}/plots/prediction_check.png",
        memory_check=f"{RESULTS}/memory_check.csv",
        compute_check=f"{RESULTS}/compute_check.csv",
    log:
        f"{RESULTS}/logs/report.log",
    params:
        pd=PD,
        config_file=CONFIG_FILE,
    conda:
        "../../environment.yml"
    threads: 1
    shell:
        "{params.pd} report --config {params.config_file} > {log} 2>&1"
