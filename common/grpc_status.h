// Conversions between absl::Status and grpc::Status. The canonical codes are
// the same numbers in both, so a status keeps its code and message across the
// wire in both directions.
#ifndef GRADSYNC_COMMON_GRPC_STATUS_H_
#define GRADSYNC_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace gradsync {

// Converts a library status into the status a gRPC handler returns.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Converts the status of a finished gRPC call into an absl::Status.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_GRPC_STATUS_H_
