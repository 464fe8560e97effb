"""The applications on top of every layer: `tour` (measure this machine, predict it, write the report) and
`doctor` (configuration, health counters, copy and pair checks). They run benchmarks, training and predictions;
`meshscale.report` only renders what they and the other commands produce."""
