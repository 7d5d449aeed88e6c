"""report stage of the detour pipeline."""
