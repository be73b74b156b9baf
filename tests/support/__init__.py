"""Test support: tiny upstreams, config builders, the gateway stack on free ports."""
