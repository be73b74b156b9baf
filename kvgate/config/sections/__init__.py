"""The config's sections, one module each: their dataclasses are the schema
(kvgate.config.schema)."""
