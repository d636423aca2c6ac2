# pipedream-repro workflow: profile -> plan -> train (pipedream, dp) -> report.
# `make run` runs it with experiments/ci.yaml; pass --configfile experiments/table1.yaml for paper scale.
import os
import sys

from snakemake.utils import validate


# the reduced CPU config unless --configfile names another (configs are not merged with it)
if not workflow.configfiles:

    configfile: "experiments/ci.yaml"


validate(config, "workflows/schemas/config.schema.yaml")

RESULTS = config["results_dir"]
MODELS = list(config["models"])
CLUSTER = config["cluster"]
MODES = ["pipedream", "dp"]
PD = f"{sys.executable} -m pipedream.cli"
CONFIG_FILE = str(workflow.configfiles[-1])
# models of Table 1 without a V100 profile in the release: the predicted table reads our own profiles (numbers only
# from one whose meta.json says v100_scale, pipedream/table1/predicted.py)
OWN_PROFILE_MODELS = [m for m in MODELS if m in ("awd_lm", "s2vt")]


include: "workflows/rules/common.smk"
include: "workflows/rules/profile.smk"
include: "workflows/rules/plan.smk"
include: "workflows/rules/train.smk"
include: "workflows/rules/report.smk"
include: "workflows/rules/twobw.smk"


# Table 1 (experiments/ci.yaml, table1.yaml), or PipeDream-2BW's table for a config with a twobw: section
# (experiments/2bw.yaml, `make run-2bw`)
rule all:
    default_target: True
    input:
        TWOBW_OUTPUTS
        if TWOBW
        else [
            f"{RESULTS}/table1.md",
            f"{RESULTS}/table1.csv",
            f"{RESULTS}/report.html",
            f"{RESULTS}/table1_predicted.md",
        ],
