"""dualpath.workload"""
