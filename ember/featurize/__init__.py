"""ember.featurize."""
