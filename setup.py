"""Build hook: generate gRPC stubs from proto/rdtune/v1/*.proto when a wheel is built."""

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithProto(build_py):
    def run(self):
        from proto.build import build

        build(force=True)
        super().run()


setup(cmdclass={"build_py": BuildWithProto})
