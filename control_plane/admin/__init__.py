"""The control plane's admin gRPC server (proto/kvgate/admin/v1/admin.proto).

The API's generated modules, auth and TLS are in kvgate.admin_api, shared with the CLI.
"""
