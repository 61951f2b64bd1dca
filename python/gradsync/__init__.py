"""gradsync's Python client: jobs, status, watch and the key-value store of
a gradsync coordinator (gradsync.Client), and PyTorch integration
(gradsync.torch: a torch.distributed Store on the coordinator's key-value
store and the gradsync:// init method).

Pure Python on Debian's python3-grpcio and python3-protobuf; the stubs come
from python/build_stubs.sh.
"""
from gradsync.client import Client, Error, KeyValue

__all__ = ["Client", "Error", "KeyValue"]
