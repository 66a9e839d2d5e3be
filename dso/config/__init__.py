"""One configuration object for every process: the schema, its node-local sections, and its sources."""
