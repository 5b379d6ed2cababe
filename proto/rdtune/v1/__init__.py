"""The generated stubs of the ``rdtune.v1`` protobuf package (made by proto/build.py)."""

from pathlib import Path

if not Path(__file__).with_name("types_pb2.py").exists():
    from proto.build import missing_message

    raise ModuleNotFoundError(missing_message(), name=__name__)
