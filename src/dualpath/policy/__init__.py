"""dualpath.policy"""
