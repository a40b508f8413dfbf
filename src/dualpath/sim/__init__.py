"""dualpath.sim"""
