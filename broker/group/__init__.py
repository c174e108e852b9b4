"""Consumer groups (KIP-848): the coordinator's sans-I/O core and its assignors."""
