"""mistill.models"""
