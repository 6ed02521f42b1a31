"""State that replicas of one deployment share (`settings.StateSettings`): run records,
API keys and promotions in PostgreSQL, rate-limit buckets in Redis."""
