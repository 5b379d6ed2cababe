"""gRPC server reflection, both versions clients use: ``grpc.reflection.v1`` (grpcurl,
Postman, current gRPC tooling) and the older ``grpc.reflection.v1alpha``.

grpcio-reflection serves only v1alpha. The v1 protocol is the same messages under another
package, so the same servicer answers it: the v1 service is registered with v1alpha's
(byte-identical) message codecs, and v1's file descriptor, built from v1alpha's with the
package renamed, joins the default pool so that v1 can describe itself too. On a grpc.aio
server (the agent's) both are grpcio-reflection's asyncio servicer.
"""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import _async as reflection_aio
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha

V1_SERVICE = "grpc.reflection.v1.ServerReflection"
V1ALPHA_SERVICE = reflection.SERVICE_NAME  # grpc.reflection.v1alpha.ServerReflection
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _add_v1_descriptor() -> None:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
        return  # already there (a grpcio-reflection that ships v1, or a second server)
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    v1alpha.DESCRIPTOR.CopyToProto(fdp)
    alpha_pkg = fdp.package
    fdp.name, fdp.package = _V1_FILE, "grpc.reflection.v1"
    fdp.ClearField("options")
    for message in fdp.message_type:
        for field in message.field:
            if field.type_name.startswith(f".{alpha_pkg}."):
                field.type_name = field.type_name.replace(alpha_pkg, fdp.package, 1)
    for service in fdp.service:
        for method in service.method:
            method.input_type = method.input_type.replace(alpha_pkg, fdp.package, 1)
            method.output_type = method.output_type.replace(alpha_pkg, fdp.package, 1)
    pool.Add(fdp)


def enable(service_names: tuple[str, ...], server: grpc.Server | grpc.aio.Server) -> None:
    """Serve reflection v1 and v1alpha for ``service_names`` (and themselves) on ``server``."""
    _add_v1_descriptor()
    names = (*service_names, V1_SERVICE, V1ALPHA_SERVICE)
    if isinstance(server, grpc.aio.Server):
        servicer = reflection_aio.ReflectionServicer(names)
    else:
        servicer = reflection.ReflectionServicer(names)
    reflection.enable_server_reflection(names, server)  # v1alpha
    v1 = grpc.method_handlers_generic_handler(
        V1_SERVICE,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=v1alpha.ServerReflectionRequest.FromString,
                response_serializer=v1alpha.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))
