"""Generated protobuf/gRPC code for `proto/dlu/elastic/v1` (regenerate: `scripts/gen_proto.py`).

Lives at the proto package path so the generated imports (`from dlu.elastic.v1 import
elastic_pb2`) work unchanged; `dlu` and `dlu.elastic` are namespace packages (no `__init__.py`).
"""
