"""mistill.repro"""
