"""Table 1 of the paper, rebuilt: what was measured here (:mod:`.measured`), what the planner and simulator
predict at paper scale (:mod:`.predicted`) and why a prediction differs from the paper (:mod:`.explain`),
the three side by side (:mod:`.table`), their plots (:mod:`.plots`) and the HTML page (:mod:`.html`)."""
