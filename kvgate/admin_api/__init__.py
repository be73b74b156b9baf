"""The admin gRPC API (proto/kvgate/admin/v1/admin.proto) as both ends need it: the generated
`v1` modules, bearer-token auth (`auth`) and TLS (`tls`). The control plane serves it
(control_plane.admin), the CLI calls it (kvgate_cli.admin); neither imports the other.
"""
