"""dualpath.spec"""
