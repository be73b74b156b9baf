"""`kvgate endpoints|sessions|status`: clients of the control plane's admin gRPC API."""
