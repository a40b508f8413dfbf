"""dualpath.runtime"""
