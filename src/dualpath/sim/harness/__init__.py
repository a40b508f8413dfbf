"""The experiment harness around the simulator: workloads and cluster presets (``experiments``),
runs of one or several systems (``runner``), online capacity sweeps (``online``) and the paper's
figures (``figures``). It may use ``dualpath.workload``; the model (the rest of ``dualpath.sim``)
does not, and never imports the harness."""
