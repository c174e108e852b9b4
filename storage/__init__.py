"""rillet.storage"""
