"""ember.checkpoint."""
