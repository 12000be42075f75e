"""mistill.stats"""
