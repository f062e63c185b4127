"""The journaling proxy between an external agent and the run's target model."""
