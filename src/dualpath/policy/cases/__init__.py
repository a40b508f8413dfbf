"""Recorded conformance cases (``conformance_v1.json``) and the recorder that made them."""
