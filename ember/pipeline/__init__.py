"""ember.pipeline."""
