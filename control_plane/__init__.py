"""kvgate's control plane: Envoy resources from config, served over xDS."""
