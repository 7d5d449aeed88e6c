"""eval stage of the detour pipeline."""
