"""ember.tiers."""
