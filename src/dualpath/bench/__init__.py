"""dualpath.bench"""
