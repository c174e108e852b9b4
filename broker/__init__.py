"""rillet.broker"""
