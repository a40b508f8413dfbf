"""dualpath.planner"""
