"""dualpath.latency: the benchmark a ``plan latency`` row measured, simulated on the sim event kernel
(closed-loop clients, each backend's scheduler, disaggregated prefill / decode workers)."""
