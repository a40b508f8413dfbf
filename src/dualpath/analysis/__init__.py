"""dualpath.analysis"""
