"""The disaggregated cluster: scheduler service, engine processes, client (docs/cluster.md)."""
