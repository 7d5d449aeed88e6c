"""train stage of the detour pipeline."""
