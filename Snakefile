# pipedream-repro workflow: profile -> plan -> train (pipedream, dp) -> report.
# `make run` runs it with experiments/ci.yaml; pass --configfile experiments/table1.yaml for paper scale.
import sys

from snakemake.utils import validate


configfile: "experiments/ci.yaml"


validate(config, "workflows/schemas/config.schema.yaml")

RESULTS = config["results_dir"]
MODELS = list(config["models"])
CLUSTER = config["cluster"]
MODES = ["pipedream", "dp"]
PD = f"{sys.executable} -m pipedream.cli"


include: "workflows/rules/common.smk"
include: "workflows/rules/profile.smk"
include: "workflows/rules/plan.smk"
include: "workflows/rules/train.smk"
include: "workflows/rules/report.smk"


rule all:
    input:
        f"{RESULTS}/table1.md",
        f"{RESULTS}/table1.csv",
        expand(f"{RESULTS}/plots/{{model}}_accuracy_vs_time.png", model=MODELS),
