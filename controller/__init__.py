"""rillet.controller"""
