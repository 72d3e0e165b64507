"""ember.models.layers."""
