"""ember.train."""
