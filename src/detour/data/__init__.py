"""data stage of the detour pipeline."""
