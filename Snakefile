# pipedream-repro workflow: profile -> plan -> train (pipedream, dp) -> report.
# `make run` runs it with experiments/ci.yaml; pass --configfile experiments/table1.yaml for paper scale.
import os
import sys

from snakemake.utils import validate

from pipedream.errors import PipeDreamError
from pipedream.table1.table import read_paper_table


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
# the predicted Table 1 covers the config's models that the paper's table has: a config of some of them (the tests'
# one-model run) does not wait for every other row's planning and simulation; all rows (and the H100 what-if) when
# the config has all of them, or none of them (a user's own models)
try:
    PAPER_MODELS = set(read_paper_table(config["paper_table"])["model"])
except PipeDreamError:  # missing or not CSV: `pipedream check` and the predicted rule's missing input say so
    PAPER_MODELS = set()
PREDICTED_MODELS = [m for m in MODELS if m in PAPER_MODELS]
PREDICTED_MODELS_ARG = (f"--models {' '.join(PREDICTED_MODELS)}"
                        if PREDICTED_MODELS and set(PREDICTED_MODELS) != PAPER_MODELS else "")


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
