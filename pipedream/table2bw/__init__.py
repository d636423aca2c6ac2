"""PipeDream-2BW's table: 2BW against GPipe, PipeDream-Flush, 1F1B and DP, measured on the reduced GPT and
predicted at paper scale (:mod:`.paper`: the GPT models' costs from FLOP counts; :mod:`.table`: the rows,
``results/table_2bw.{csv,md}``)."""
