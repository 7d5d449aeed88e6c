"""analysis stage of the detour pipeline."""
