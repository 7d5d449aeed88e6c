"""model stage of the detour pipeline."""
