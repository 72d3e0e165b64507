"""ember.source."""
