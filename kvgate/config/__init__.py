"""kvgate's configuration: one YAML file, parsed strictly, validated as a whole."""

from kvgate.config.errors import ConfigError, Problem
from kvgate.config.load import load_file, load_text
from kvgate.config.model import Config, Endpoint, HostPort, Pool, Route

__all__ = [
    "Config", "ConfigError", "Endpoint", "HostPort", "Pool", "Problem", "Route",
    "load_file", "load_text",
]
