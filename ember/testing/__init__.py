"""ember.testing."""
