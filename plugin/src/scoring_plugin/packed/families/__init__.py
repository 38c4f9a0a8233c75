"""Model families served packed, each declaring what differs (see scoring_plugin.packed.families.registry)."""
