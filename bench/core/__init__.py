"""What every run is made of: the configuration and its options, workloads, the latency
recorder, the report and the plot; imports nothing else from bench."""
