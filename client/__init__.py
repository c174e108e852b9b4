"""rillet.client"""
