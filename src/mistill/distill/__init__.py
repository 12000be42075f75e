"""mistill.distill"""
