// Early-return helpers for absl::Status / absl::StatusOr (abseil 20220623 has
// none of its own).
#ifndef GRADSYNC_COMMON_STATUS_MACROS_H_
#define GRADSYNC_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define GS_RETURN_IF_ERROR(expr)                      \
  do {                                                \
    ::absl::Status gs_status_ = (expr);               \
    if (!gs_status_.ok()) return gs_status_;          \
  } while (0)

#define GS_STATUS_CONCAT_INNER_(a, b) a##b
#define GS_STATUS_CONCAT_(a, b) GS_STATUS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, else
// moves the value into `lhs` (a declaration such as `auto x` or a variable).
#define GS_ASSIGN_OR_RETURN(lhs, rexpr) \
  GS_ASSIGN_OR_RETURN_IMPL_(GS_STATUS_CONCAT_(gs_statusor_, __LINE__), lhs, rexpr)

#define GS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // GRADSYNC_COMMON_STATUS_MACROS_H_
