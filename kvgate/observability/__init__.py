"""Logs and metrics shared by every kvgate service."""
