"""study stage: a matched study as cached steps (detour study, detour demo)."""
