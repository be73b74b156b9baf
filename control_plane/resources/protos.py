"""Small constructors for well-known protobuf values used across the builders."""

from __future__ import annotations

from envoy.config.core.v3 import address_pb2, extension_pb2
from google.protobuf import any_pb2, duration_pb2, wrappers_pb2
from google.protobuf.message import Message

from kvgate.config.model import HostPort


def duration(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(round(seconds * 1e9))
    return value


def u32(value: int) -> wrappers_pb2.UInt32Value:
    return wrappers_pb2.UInt32Value(value=value)


def u64(value: int) -> wrappers_pb2.UInt64Value:
    return wrappers_pb2.UInt64Value(value=value)


def pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def typed_extension(name: str, message: Message) -> extension_pb2.TypedExtensionConfig:
    return extension_pb2.TypedExtensionConfig(name=name, typed_config=pack(message))


def socket_address(address: HostPort) -> address_pb2.Address:
    return address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address=address.host, port_value=address.port)
    )


def bool_value(value: bool) -> wrappers_pb2.BoolValue:
    return wrappers_pb2.BoolValue(value=value)
