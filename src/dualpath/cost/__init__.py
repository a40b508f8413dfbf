"""dualpath.cost"""
