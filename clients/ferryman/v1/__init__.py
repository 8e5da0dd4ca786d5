"""Generated protobuf and gRPC code for ferryman.v1 (do not edit)."""
