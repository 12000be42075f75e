"""mistill.world"""
