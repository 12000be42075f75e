"""mistill.instrument"""
