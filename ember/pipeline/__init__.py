"""ember.pipeline: the stages' scheduler (threads + bounded queues, or in line), the data
stages (``loader``), bounded embedding staleness (``staleness``) and the ``pipeline:`` config."""
