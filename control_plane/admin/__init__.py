"""The control plane's admin gRPC API (proto/kvgate/admin/v1/admin.proto).

Kept import-light: the CLI imports `auth` and the generated `v1` modules without the server.
"""
