"""mistill.evaluate"""
